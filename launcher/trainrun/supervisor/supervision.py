"""How the launcher supervises a job: every timeout, resolved once from the options (launchspec.resolve), and
the parameter-server restart limit. Every mode reads them from here (a static Job, each elastic attempt,
`--mpi openmpi`'s Job, `--check`'s fact collection and `--perf`), so no mode keeps a number of its own.
"""
from __future__ import annotations

from typing import NamedTuple


AGENT_START_SLACK = 30.0
"""Seconds beyond --ssh-timeout that a host's first answer may take (an agent's HELLO, `--check`'s facts, a
link benchmark's start): the connection is made within --ssh-timeout, then an interpreter starts and imports
trainrun there, which on a busy host or a cold file system takes seconds. The one copy of this number."""


class Supervision(NamedTuple):  # (not a dataclass: see plan/planner.py's note)
    """`grace`: SIGTERM -> SIGKILL (--grace). `start_timeout`: the MPI world must form within it (--start-timeout).
    `hang_timeout`: no output and no runtime progress for that long ends the job with 124 (None: never).
    `heartbeat_timeout`: a silent peer (agent or launcher) is lost after it. `ssh_timeout`: a connection to a
    host is made within it. `ps_restarts`: --tf-cluster's restarts per worker task."""

    grace: float = 3.0
    start_timeout: float = 120.0
    hang_timeout: float | None = None
    heartbeat_timeout: float = 15.0
    ssh_timeout: float = 15.0
    ps_restarts: int = 3

    @property
    def host_answer(self) -> float:
        """Seconds a host has to answer once asked to start something (connect + interpreter start-up)."""
        return self.ssh_timeout + AGENT_START_SLACK
