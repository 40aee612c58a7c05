"""The Slurm engine meets a host as the SSH engine does (`slurm` fixture: real slurmctld/slurmd per simulated
host): the interpreter pick with its one-line errors (fanout/python_pick.py), and a lost host cleaned up by a
new step running the reaper (SrunEngine.sweep). Everything starts from h1, the login node."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.cluster.test_slurm_launch import MARK, TRAINRUN, jobs_cancelled, wait_until_clean  # noqa: F401 (fixture)


def test_a_python_path_missing_on_the_host_is_named_not_replaced(slurm, tmp_path, jobs_cancelled):  # noqa: F811
    """Before: the step's shell took python3 in its place (and that one has no trainrun)."""
    p = slurm.run(1, ["salloc", "-N2", *TRAINRUN, "--engine", "slurm", "-H", "h2:1", "--python", "/opt/nowhere/bin/python3",
                      "true"], cwd=tmp_path, timeout=120)
    lines = [ln for ln in p.stderr.strip().splitlines() if not ln.startswith("salloc:")]
    assert p.returncode == 3 and lines == [
        "trainrun: error: h2: python: --python /opt/nowhere/bin/python3: no such interpreter there "
        "(check the path given to --python)"], p.stderr


def test_no_python_on_the_host_is_one_line(slurm, cluster, tmp_path, jobs_cancelled):  # noqa: F811
    """h2's interpreters shadowed by /dev/null in its mount namespace (where its slurmd runs the steps).
    Before: the shell's `exec: python3: Permission denied`."""
    shims = [os.path.expanduser("~/.pyenv/shims/python3"), "/usr/local/bin/python3", "/usr/bin/python3"]
    targets = [os.path.realpath(sys.executable), *(os.path.realpath(p) for p in shims if os.path.exists(p))]
    mounted = []
    try:
        for t in targets:
            if t not in mounted:
                cluster.run(2, ["mount", "--bind", "/dev/null", t], check=True)
                mounted.append(t)
        p = slurm.run(1, ["salloc", "-N2", *TRAINRUN, "--engine", "slurm", "-H", "h2:1", "true"], cwd=tmp_path, timeout=120)
    finally:
        for t in reversed(mounted):
            cluster.run(2, ["umount", t])
    lines = [ln for ln in p.stderr.strip().splitlines() if not ln.startswith("salloc:")]
    assert p.returncode == 3 and lines == ["trainrun: error: h2: python: python3 not found (pass --python)"], p.stderr


def _agents_on(host: str) -> list[int]:
    """Pids of trainrun agents whose Slurm step runs on `host` (SLURMD_NODENAME in their environment)."""
    pids = []
    for pid in subprocess.run(["pgrep", "-f", "trainrun.agent"], capture_output=True, text=True).stdout.split():
        pid = int(pid)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if f"SLURMD_NODENAME={host}".encode() in env and b"trainrun.agent" in cmd:
            pids.append(pid)
    return pids


def test_a_stopped_agent_is_cleaned_up_by_a_new_step(slurm, cluster, tmp_path, jobs_cancelled):  # noqa: F811
    """The agent on h2 SIGSTOPped in a 3-host Slurm launch: the host is lost (255), a new step there runs the
    reaper, which kills the agent and its rank, and the summary says so. Before: no sweep on Slurm (no such
    line; the ranks lived until the stopped agent's own watchdog)."""
    prog = f"import os, time; open('up.' + os.environ['RANK'], 'w').close(); time.sleep(300)  # {MARK}"
    proc = slurm.popen(1, ["salloc", "-N3", *TRAINRUN, "--heartbeat-timeout", "5", sys.executable, "-c", prog],
                       cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    stopped: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"up.{r}").exists() for r in range(3)):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate(timeout=5)
            time.sleep(0.1)
        agents = _agents_on("h2")
        stopped = [p for p in agents if _ppid(p) not in agents]  # the agent, not its forked watchdog
        assert len(stopped) == 1, agents
        os.kill(stopped[0], signal.SIGSTOP)
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 255, err
        assert "h2: killed its agent and its 1 rank(s) over a new connection" in err, err
        assert not os.path.exists(f"/proc/{stopped[0]}") or _state(stopped[0]) == "Z", "the stopped agent lives"
        assert wait_until_clean(cluster, 10) == {}
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
