"""SrunEngine's agent and module steps pick the interpreter as the SSH engine does (fanout/python_pick.py),
checked through a stand-in `srun` on PATH that drops its options and runs the step's command here (the real
Slurm path is tests/cluster/test_slurm_hosts.py). Before: the step ran `[ -x "$p" ] || p=python3`, so a wrong
--python was silently replaced and a host without python3 gave the shell's `exec: python3: ...` line."""
from __future__ import annotations

import os
import sys
import time

import pytest

from trainrun.errors import HostError
from trainrun.fanout.srun_engine import SrunEngine
from trainrun.slurm.allocation import Allocation, SlurmHost

FAKE_SRUN = """#!/bin/sh
# stand-in for srun: a line of its own on stderr (as srun may write first), then the step's command, here
echo "srun: step created for job 1" >&2
while [ $# -gt 0 ]; do case $1 in -*) shift ;; *) break ;; esac; done
exec "$@"
"""


@pytest.fixture
def fake_srun(tmp_path, monkeypatch):
    (tmp_path / "srun").write_text(FAKE_SRUN)
    (tmp_path / "srun").chmod(0o755)
    (tmp_path / "sh").symlink_to("/bin/sh")
    monkeypatch.setenv("PATH", str(tmp_path))  # sh and srun only: no python3 to fall back on
    return tmp_path


def _engine(python: str, strict: bool) -> SrunEngine:
    return SrunEngine(Allocation("1", (SlurmHost("h2", 1),)), python, strict_python=strict)


def _start_error(engine: SrunEngine) -> str:
    link = engine.start_agent("h2")
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                _, _, ended = link.read()
            except HostError as err:
                return str(err)
            if ended:
                return "ended without the error"
            time.sleep(0.05)
        return "no answer"
    finally:
        link.close(5)


@pytest.mark.parametrize("python, strict, said", [
    ("/opt/nowhere/bin/python3", True,
     "h2: python: --python /opt/nowhere/bin/python3: no such interpreter there (check the path given to --python)"),
    ("/opt/nowhere/bin/python3", False, "h2: python: python3 not found (pass --python)"),
])
def test_the_agents_step_names_a_missing_interpreter(fake_srun, python, strict, said):
    assert _start_error(_engine(python, strict)) == said


def test_a_module_step_runs_the_given_interpreter(fake_srun):
    ch = _engine(sys.executable, True).run_module("h2", "platform")
    try:
        assert ch.exit_status() == 0 and ch.read().strip()
    finally:
        ch.close()
    assert os.environ["PATH"] == str(fake_srun)
