"""Nothing of a job is left on any host (issue 25, items 2 and 3), on the simulated hosts.

- Processes that drop the job's environment (`env -i setsid` sleepers, double-forked daemons with an empty
  environment) end with the job on this machine and on every remote host, after success, failure and a
  SIGKILLed launcher: the launcher and every agent are child subreapers and kill the trees below them.
- A lost host is cleaned up: an agent SIGSTOPped on one host is killed with its ranks over a fresh SSH
  connection; a host cut off from the network (its eth0 down, so no fresh connection either) is named as
  unreachable, and its agent ends its ranks within the bound the message gives.
All simulated hosts share one PID namespace, so the job's processes are found by a token in their argv.
"""
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from trainrun.supervisor.watchdog import POLL_S

testbed = sys.modules["trainrun_testbed"]   # scripts/testbed.py, as conftest.py loaded it

ESCAPEES = str(Path(__file__).parents[1] / "process" / "workers" / "escapees.py")
TEARDOWN_S = 10.0  # generous upper bound for "quickly" on a busy 2-core box


def argv(cluster, *args):
    return [sys.executable, "-m", "trainrun", "--ssh-config", str(cluster.ssh_config), *map(str, args)]


procs_with = testbed.procs_with
kill_all = testbed.kill_procs_with


def on_host(cluster, i: int, pids) -> list[int]:
    return cluster.on_host(i, pids)


def wait_none(token: str, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := procs_with(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def wait_up(proc: subprocess.Popen, n: int) -> None:
    for _ in range(n):
        line = proc.stdout.readline()
        assert line.endswith(b"up 2\n"), line + proc.stderr.read()


@pytest.mark.parametrize("end", ["ok", "fail", "launcher-sigkill"])
def test_no_process_of_the_job_survives_on_any_host(cluster, tmp_path, end):
    """2 ranks on h1, 1 here, 1 on h2, each leaving an `env -i setsid` sleeper and a double-forked
    empty-environment daemon: zero processes with the job's token anywhere once the launcher has ended."""
    token = f"esc{uuid.uuid4().hex[:8]}"
    mode = "sleep" if end == "launcher-sigkill" else end
    proc = subprocess.Popen(argv(cluster, "-H", "h1:2,localhost:1,h2:1", sys.executable, ESCAPEES, token, mode),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        if end == "launcher-sigkill":
            wait_up(proc, 4)
            running = procs_with(token)
            assert len(running) >= 12, running  # 4 ranks, 2 escapees each
            assert on_host(cluster, 1, running) and on_host(cluster, 2, running)
            time.sleep(2 * POLL_S)  # the local watchdog sees an adopted orphan within POLL_S (its documented limit)
            proc.kill()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == {"ok": 0, "fail": 3, "launcher-sigkill": -9}[end], err.decode()
        left = wait_none(token, TEARDOWN_S)
        assert left == [], f"left after the job ({end}): {left}"
    finally:
        proc.kill()
        proc.communicate()
        kill_all(token)


def the_agent_on(cluster, i: int) -> tuple[int, list[int]]:
    """The pid of the trainrun agent on host i, and of its watchdog (a fork with the same command line)."""
    agents = procs_with("trainrun.agent")
    here = on_host(cluster, i, agents)
    parents = {pid: int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in here}
    top = [pid for pid in here if parents[pid] not in here]
    assert len(top) == 1, (here, parents)
    return top[0], [pid for pid in here if parents[pid] == top[0]]


def test_a_stopped_agent_is_killed_with_its_ranks_over_a_fresh_connection(cluster, tmp_path):
    """Agent SIGSTOPped on h2, and its watchdog too (so that only the launcher can act; the watchdog alone is
    tested in tests/process/test_agent.py): exit 255, the summary says h2 was cleaned up over a new
    connection, and within seconds no process of the job is left on h2 (the agent included)."""
    token = f"stop{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(argv(cluster, "--heartbeat-timeout", 3, "-H", "h1:1,h2:2", sys.executable, ESCAPEES, token,
                                 "sleep"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    agent, watchdog = None, []
    try:
        wait_up(proc, 3)
        assert len(on_host(cluster, 2, procs_with(token))) == 6  # 2 ranks, 2 escapees each
        agent, watchdog = the_agent_on(cluster, 2)
        assert len(watchdog) == 1
        for pid in (*watchdog, agent):
            os.kill(pid, signal.SIGSTOP)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 255, err.decode()
        assert "no word from the agent on h2" in err.decode()
        assert "h2: killed its agent and its 2 rank(s) over a new connection" in err.decode()
        assert "stopped all 3 rank(s)" in err.decode()
        left = wait_none(token, 5.0)
        assert left == [], f"left after the host was lost: {left}"
        for pid in (agent, *watchdog):
            assert not os.path.exists(f"/proc/{pid}") or Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    finally:
        proc.kill()
        proc.communicate()
        resume(agent, watchdog)
        kill_all(token)


def resume(agent: int | None, watchdog) -> None:
    """SIGCONT a stopped agent and its watchdog, so that the test's own cleanup can end them."""
    for pid in (() if agent is None else (agent, *watchdog)):
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass


def test_a_host_cut_off_is_named_and_its_ranks_end_within_the_bound(cluster, tmp_path):
    """h3's eth0 (the launcher's route to it) goes down mid-job: exit 255; the summary says h3 could not be
    reached, that its 2 ranks may still run and within how many seconds its agent ends them; they do."""
    token = f"cut{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(argv(cluster, "--heartbeat-timeout", 3, "--ssh-timeout", 3, "-H", "h1:1,h3:2",
                                 sys.executable, ESCAPEES, token, "sleep"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        wait_up(proc, 3)
        assert len(on_host(cluster, 3, procs_with(token))) == 6
        with cluster.link_down(3) as t_cut:
            out, err = proc.communicate(timeout=60)
            text = err.decode()
            assert proc.returncode == 255, text
            # the heartbeat (3 s) or, as often first, the kernel ending the SSH connection (2 s without an answer)
            assert "no word from the agent on h3" in text or "lost the agent on h3 (the SSH connection" in text, text
            assert "h3 unreachable (tcp: connection to 10.241.0.4:22 timed out): its 2 rank(s) may still run; " \
                   "the agent there ends them within " in text, text
            assert "stopped 1 of 3 rank(s)" in text
            bound = int(text.split("the agent there ends them within ", 1)[1].split("s", 1)[0])
            left_at = time.monotonic()
            left = wait_none(token, bound + 3.0)  # the bound, and a little for this test to look
            assert left == [], f"h3's ranks still ran {time.monotonic() - left_at:.1f}s after the launcher's report: {left}"
            print(f"cut -> ranks gone: {time.monotonic() - t_cut:.1f}s")
    finally:
        proc.kill()
        proc.communicate()
        kill_all(token)


SLEEPER = str(Path(__file__).parents[1] / "process" / "workers" / "mpi_sleep.py")
LOST_CLEAN_S = 30.0  # issue 38: nothing of the job on a lost host 30 s after the launcher reports it lost


def ups(stdout: str) -> dict[int, tuple[str, str]]:
    """rank -> (job id, stack file) from mpi_sleep.py's `[R]<stdout>:up JOB FILE` lines."""
    out = {}
    for line in stdout.splitlines():
        head, _, rest = line.partition("<stdout>:up ")
        if rest:
            job, path = rest.split()
            out[int(head.strip("[]"))] = (job, path)
    return out


def host_leftovers(cluster, i: int, token: str, job: str, stack_files) -> list[str]:
    """What job `job` still has on host i: processes (by token), MPICH segments in its own /dev/shm, stack files
    and the job's stack-file directory for it (/tmp is shared by the hosts)."""
    from trainrun.mpiworld.shm import kvsname_for, shm_segment_pattern

    pattern = shm_segment_pattern(kvsname_for(job))
    shm = cluster.run(i, ["ls", "/dev/shm"]).stdout.split()
    left = [f"pid {pid}" for pid in on_host(cluster, i, procs_with(token))]
    left += [f"/dev/shm/{name}" for name in shm if pattern.fullmatch(name)]
    left += [p for p in stack_files if os.path.exists(p)]
    return left + [str(p) for p in Path("/tmp").glob(f"trainrun-stacks-{job}-h{i}")]


def test_a_lost_host_keeps_no_process_shm_segment_or_stack_file(cluster, tmp_path):
    """2 ranks on h2 in the job's MPI world (MPICH's segment in h2's /dev/shm, each rank's stack file); h2's agent
    and its watchdog are SIGSTOPped, so only the launcher's cleanup over a new connection can act: exit 255, h2
    named lost and cleaned, and within 30 s of that report h2 has none of the job's processes, segments or
    stack files (a killed agent removes nothing itself; SIGKILLed ranks never remove their stack files)."""
    token = f"lostfiles{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(argv(cluster, "--heartbeat-timeout", 3, "-H", "h1:1,h2:2", sys.executable, SLEEPER, 600, token),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    agent, watchdog = None, []
    try:
        lines = [proc.stdout.readline().decode() for _ in range(3)]
        up = ups("".join(lines))
        assert sorted(up) == [0, 1, 2], lines
        job = up[0][0]
        on_h2 = [up[1][1], up[2][1]]
        before = host_leftovers(cluster, 2, token, job, on_h2)
        assert sum(x.startswith("/dev/shm/") for x in before) == 1 and all(p in before for p in on_h2), before
        agent, watchdog = the_agent_on(cluster, 2)
        for pid in (*watchdog, agent):
            os.kill(pid, signal.SIGSTOP)
        out, err = proc.communicate(timeout=60)
        reported = time.monotonic()
        assert proc.returncode == 255, err.decode()
        assert "h2: killed its agent and its 2 rank(s) over a new connection" in err.decode()
        while (left := host_leftovers(cluster, 2, token, job, on_h2)) and time.monotonic() < reported + LOST_CLEAN_S:
            time.sleep(0.2)
        assert left == [], f"left on h2 {time.monotonic() - reported:.0f}s after it was reported lost: {left}"
        assert host_leftovers(cluster, 1, token, job, [up[0][1]]) == []  # h1's agent cleaned up after its rank
    finally:
        proc.kill()
        proc.communicate()
        resume(agent, watchdog)
        kill_all(token)


def test_a_full_dev_shm_on_a_host_is_named_before_any_rank_starts(cluster, tmp_path):
    """h2's /dev/shm is a 2 MiB tmpfs for the test (over its own, restored after): a job with 2 ranks there
    ends before any rank starts, exit 3, the one line naming h2 from its agent's HELLO; no SIGBUS."""
    assert cluster.run(2, ["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", "/dev/shm"]).returncode == 0
    try:
        r = subprocess.run(argv(cluster, "-H", "h1:1,h2:2", sys.executable, SLEEPER, 0), capture_output=True, text=True,
                           cwd=tmp_path, timeout=90)
        assert r.returncode == 3, r.stderr
        assert r.stderr.strip().startswith("trainrun: error: h2: /dev/shm has 2 MiB free, the MPI world needs 2.1 MiB "
                                           "for its 2 rank(s) there ("), r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == "", r.stderr
    finally:
        assert cluster.run(2, ["umount", "/dev/shm"]).returncode == 0
