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


def _alive(pid: int) -> bool:
    """Runs (a zombie that some init has not reaped yet does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


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
    # every cluster of this session (test_cluster*.py name theirs pytest[-what]-<pid>) is gone
    mine = [n for n in (f"pytest-{os.getpid()}", f"pytest-kill-{os.getpid()}", f"pytest-torch-{os.getpid()}")
            if any(cluster_ctl.leftovers(cluster_ctl.project_name(n)).values())]
    for n in mine:
        cluster_ctl.down(n, Path("/nonexistent"))  # sweep by label, so the engine can stop cleanly
    if started:
        pidf = STATE / "dockerd.pid"
        pid = int(pidf.read_text()) if pidf.exists() else None
        subprocess.run(["bash", str(SETUP), "--stop"], check=True, timeout=60)
        _reap(pid)
        assert cluster_ctl.engine_problem() is not None, "dockerd started by the tests still answers"
        assert pid is None or not _alive(pid), f"dockerd (docker-init pid {pid}) still runs"
        assert not pidf.exists()
        other_dockerd = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True).returncode == 0
        assert other_dockerd or not Path("/sys/class/net/docker0").exists(), "docker0 left behind"
    assert not mine, f"clusters left behind by the tests (removed now): {mine}"


@pytest.fixture(scope="session")
def trainrun_env(tmp_path_factory):
    """Environment for launchers run by these tests: the NIC-choice cache in a temp dir, not ~/.cache."""
    return dict(os.environ, TRAINRUN_CACHE_DIR=str(tmp_path_factory.mktemp("trainrun-cache")))


def trainrun_argv(info, *args: str) -> list[str]:
    """`trainrun` from the host against cluster `info` (written hostfile + ssh_config, strict host keys).
    --python/--workdir: the launcher's interpreter path (host venv) and cwd do not exist in the nodes."""
    return [sys.executable, "-m", "trainrun", "--hostfile", info.hostfile, "--ssh-config", info.ssh_config,
            "--ssh-strict", "--python", "python3", "--workdir", "/tmp", *args]


@pytest.fixture(scope="session")
def trainrun_cmd():
    return trainrun_argv
