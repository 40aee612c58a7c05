"""Which fan-out engine a launch uses (today: SSH for any remote host)."""
from __future__ import annotations

import sys

from trainrun.fanout.base import FanoutEngine


def engine_for(cfg) -> FanoutEngine:
    """The engine that reaches this job's remote hosts. Imports paramiko (only jobs with remote hosts)."""
    from trainrun.fanout.ssh_engine import SSHEngine, ssh_options

    return SSHEngine(ssh_options(cfg), cfg.python or sys.executable, cfg.ssh_parallelism)
