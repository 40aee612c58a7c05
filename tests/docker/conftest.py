"""Fixtures for tests/docker: a Docker engine (started for the session if needed, and stopped again) and
the cluster_ctl module from scripts/. Everything here skips, with the reason, when there is no engine."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "scripts" / "ci_docker_setup.sh"
STATE = Path(os.environ.get("TRAINRUN_DOCKER_STATE", "/run/trainrun-docker"))
sys.path.insert(0, str(REPO / "scripts"))

import cluster_ctl  # noqa: E402


def _reap(pid: int | None) -> None:
    """The setup script's background docker-init is re-parented to us when tests/conftest.py made pytest a
    child subreaper: reap that one pid so it does not linger as a zombie (not our child: nothing to do)."""
    if pid is None:
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


@pytest.fixture(scope="session")
def cc():
    return cluster_ctl


@pytest.fixture(scope="session")
def engine():
    """A Docker engine that answers. Starts dockerd through scripts/ci_docker_setup.sh --start when one is
    installed but not running (TRAINRUN_DOCKER_START=0 disables that) and stops it at session end."""
    if os.geteuid() != 0:
        pytest.skip("tests/docker need root (dockerd, container networks)")
    problem = cluster_ctl.engine_problem()
    started = False
    if problem and shutil.which("dockerd") and os.environ.get("TRAINRUN_DOCKER_START", "1") != "0":
        subprocess.run(["bash", str(SETUP), "--start"], check=False, timeout=60)
        problem = cluster_ctl.engine_problem()
        started = problem is None
    if problem:
        pytest.skip(problem)
    yield {"started_dockerd": started}
    if started:
        pidf = STATE / "dockerd.pid"
        pid = int(pidf.read_text()) if pidf.exists() else None
        subprocess.run(["bash", str(SETUP), "--stop"], check=True, timeout=60)
        _reap(pid)
        assert cluster_ctl.engine_problem() is not None, "dockerd started by the tests still answers"
