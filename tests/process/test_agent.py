"""The agent protocol end to end, with the agent in a local subprocess (PipeEngine) instead of SSH."""
import json
import os
import sys
import time

import pytest

from trainrun.wire import agent_frames as wire
from trainrun.wire.agent_messages import AgentJob
from trainrun.fanout.agents import open_agents
from trainrun.fanout.pipe_engine import PipeEngine
from trainrun.plan.envcontract import JobInfo
from trainrun.plan.hosts import HostSpec
from trainrun.plan.placement import assign_ranks
from trainrun.plan.spec import build_plan
from trainrun.supervisor.job import Job
from trainrun.supervisor.local import LocalRanks
from trainrun.supervisor.output import OutputSink


def local_agent(host):
    return open_agents(PipeEngine(), [HostSpec(host)], timeout=30)[host]


def run_with_agent(plan, agent, sink, grace=1, heartbeat_timeout=15.0):
    """The launch path's Job: this machine's ranks as LocalRanks, the agent's through it."""
    agent.assign(plan.by_host()[agent.host], pmi=True, python=sys.executable, env={}, heartbeat_timeout=heartbeat_timeout)
    local = [p for p in plan.procs if p.host != agent.host]
    return Job(plan, sink, [LocalRanks(local, pmi=True), agent], grace=grace).run()


def run(code, tmp_path, np=4):
    a = assign_ranks([HostSpec("localhost", np // 2), HostSpec("far", np // 2)], np)
    plan = build_plan(a, JobInfo(os.urandom(4).hex(), "127.0.0.1", 29555), (sys.executable, "-c", code), str(tmp_path), {})
    out, err = open(tmp_path / "out", "wb+"), open(tmp_path / "err", "wb+")
    agent = local_agent("far")
    result = run_with_agent(plan, agent, OutputSink(out=out, err=err))
    out.seek(0)
    err.seek(0)
    return result, out.read().decode(), err.read().decode(), agent


def test_frames_roundtrip_in_pieces():
    data = wire.frame(wire.STDOUT, 3, b"a\x00b") + wire.json_frame(wire.HELLO, {"x": 1}) + wire.frame(wire.KILL)
    reader = wire.FrameReader()
    got = []
    for i in range(len(data)):
        got += reader.feed(data[i:i + 1])
    assert got == [(wire.STDOUT, 3, b"a\x00b"), (wire.HELLO, -1, b'{"x": 1}'), (wire.KILL, -1, b"")]


def test_agent_hello_reports_host_facts():
    agent = local_agent("far")
    try:
        assert agent.facts.cpus >= 1 and agent.facts.python and agent.facts.free_port > 0
        assert any(n.name == "lo" for n in agent.facts.nics)
    finally:
        agent.link.close(wait=5)


def test_mpi_world_spans_launcher_and_agent(tmp_path):
    code = ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
            "print(c.size, c.rank, c.allreduce(c.rank), c.Split_type(MPI.COMM_TYPE_SHARED).size)")
    result, out, _, _ = run(code, tmp_path)
    assert result.exit_code == 0, out
    lines = sorted(line.split(":", 1)[1] for line in out.splitlines())
    assert lines == ["4 0 6 2", "4 1 6 2", "4 2 6 2", "4 3 6 2"]  # 2 "nodes" of 2 local ranks


def test_remote_failure_stops_everything(tmp_path):
    code = ("import os, sys, time; r = int(os.environ['RANK']); open('pid' + str(r), 'w').write(str(os.getpid())); "
            "time.sleep(0.3); print('bye', file=sys.stderr); sys.exit(7) if r == 3 else time.sleep(60)")
    t0 = time.monotonic()
    result, _, err, agent = run(code, tmp_path)
    assert result.exit_code == 7 and time.monotonic() - t0 < 20
    assert "rank 3 on far (local rank 1) exited with code 7" in result.summary(4)
    assert result.failure.stderr_tail == ("bye",)
    assert agent.link.proc.returncode is not None  # the agent itself ended
    for r in range(4):
        pid = int((tmp_path / f"pid{r}").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_silent_agent_is_lost_after_the_heartbeat_timeout(tmp_path):
    """A hung host (here: the agent SIGSTOPped) must not hang the job: lost after the timeout, exit 255."""
    import signal
    import threading

    a = assign_ranks([HostSpec("localhost", 1), HostSpec("far", 1)], 2)
    plan = build_plan(a, JobInfo(os.urandom(4).hex(), "127.0.0.1", 29555), (sys.executable, "-c", "import time; time.sleep(60)"), str(tmp_path), {})
    agent = local_agent("far")
    threading.Timer(1.0, os.kill, (agent.link.proc.pid, signal.SIGSTOP)).start()
    t0 = time.monotonic()
    try:
        result = run_with_agent(plan, agent, OutputSink(out=open(os.devnull, "wb"), err=open(os.devnull, "wb")),
                                heartbeat_timeout=3)
    finally:
        os.kill(agent.link.proc.pid, signal.SIGCONT)
    assert result.exit_code == 255 and time.monotonic() - t0 < 20
    assert "no word from the agent on far" in result.summary(2)


def test_the_agent_gives_up_on_a_silent_launcher(tmp_path):
    """Launcher cut off (no frames): the agent kills its ranks and exits after its patience."""
    a = assign_ranks([HostSpec("far", 1)], 1)
    plan = build_plan(a, JobInfo(os.urandom(4).hex(), "127.0.0.1", 1), (sys.executable, "-c", "import time; time.sleep(60)"), str(tmp_path), {})
    agent = local_agent("far")
    agent.link.write(wire.frame(wire.JOB, -1, AgentJob((plan.procs[0],), pmi=False, python="", patience=1.5).to_bytes()))
    assert agent.link.proc.wait(15) == 0  # no more frames from us: it ends by itself
    started = [json.loads(p) for k, _, p in agent.reader.feed(agent.link.proc.stdout.read()) if k == wire.STARTED]
    pid = started[0]["0"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_the_agent_removes_its_hosts_shm_segments(tmp_path):
    """On a remote host only the agent can remove what a killed MPI job left in /dev/shm there."""
    from trainrun.mpiworld import shm

    kvsname = shm.kvsname_for(f"agenttest{os.getpid()}")
    segment = f"/dev/shm/mpich_shm_{shm.world_id(kvsname):x}_1"
    code = f"open({segment!r}, 'w').write('left by a killed rank')"
    plan = build_plan(assign_ranks([HostSpec("far", 1)], 1), JobInfo(os.urandom(4).hex(), "127.0.0.1", 1), (sys.executable, "-c", code),
                      str(tmp_path), {})
    agent = local_agent("far")
    agent.link.write(wire.frame(wire.JOB, -1, AgentJob((plan.procs[0],), pmi=True, python="", patience=60.0,
                                                       kvsname=kvsname).to_bytes()))
    try:
        assert agent.link.proc.wait(30) == 0
        assert not os.path.exists(segment)
    finally:
        if os.path.exists(segment):
            os.unlink(segment)


def test_a_stopped_agents_host_is_cleaned_up_over_a_new_connection(tmp_path):
    """Agent SIGSTOPped (it cannot act, its channel stays open): the launcher reports the host lost (255),
    then kills the agent and everything below it -- ranks, an `env -i setsid` sleeper and a double-forked
    daemon with no environment -- over a new connection (PipeEngine: a new local process), and says so."""
    import signal
    import threading
    import uuid

    from launch_helpers import assert_none_with, procs_with, worker

    token = f"stop{uuid.uuid4().hex[:8]}"
    a = assign_ranks([HostSpec("localhost", 1), HostSpec("far", 2)], 3)
    plan = build_plan(a, JobInfo(os.urandom(4).hex(), "127.0.0.1", 29555),
                      (sys.executable, worker("escapees.py"), token, "sleep"), str(tmp_path), {})
    agent = local_agent("far")
    pid = agent.link.proc.pid

    def stop_when_up():
        deadline = time.monotonic() + 30
        while len(procs_with(token)) < 9 and time.monotonic() < deadline:  # 3 ranks, 2 escapees each
            time.sleep(0.1)
        os.kill(pid, signal.SIGSTOP)

    threading.Thread(target=stop_when_up, daemon=True).start()
    try:
        result = run_with_agent(plan, agent, OutputSink(out=open(os.devnull, "wb"), err=open(os.devnull, "wb")),
                                heartbeat_timeout=3)
        summary = result.summary(3)
        assert result.exit_code == 255, summary
        assert "far: killed its agent and its 2 rank(s) over a new connection" in summary
        assert "stopped all 3 rank(s)" in summary
        assert agent.link.proc.wait(5) == -signal.SIGKILL
        assert_none_with(token, 5.0, "processes of the stopped agent's job")
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_the_watchdog_ends_a_stopped_agent_and_its_ranks(tmp_path):
    """No fresh connection (the launcher is gone, or sshd does not answer either): the agent's watchdog,
    a process of its own, kills the agent once it has been stopped for its patience, and every rank."""
    import signal
    import uuid

    from launch_helpers import assert_none_with, procs_with, worker

    token = f"wdog{uuid.uuid4().hex[:8]}"
    plan = build_plan(assign_ranks([HostSpec("far", 2)], 2), JobInfo(os.urandom(4).hex(), "127.0.0.1", 1),
                      (sys.executable, worker("escapees.py"), token, "sleep"), str(tmp_path), {})
    agent = local_agent("far")
    pid = agent.link.proc.pid
    agent.link.write(wire.frame(wire.JOB, -1, AgentJob(plan.procs, pmi=False, python="", patience=2.0).to_bytes()))
    try:
        deadline = time.monotonic() + 30
        while len(procs_with(token)) < 6 and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        assert agent.link.proc.wait(10) == -signal.SIGKILL
        assert time.monotonic() - t0 < 10
        assert_none_with(token, 5.0, "ranks of the stopped agent")
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_the_sweep_kills_a_stopped_subreapers_whole_tree(tmp_path):
    """`python -m trainrun.supervisor.reaper JOB HOST PID:START` (what the launcher runs on a lost host): a stopped
    subreaper (the agent) with a child (a rank) that left an `env -i setsid` sleeper and a double-forked
    daemon with no environment: all of them end, and it exits 0. A PID:START of another process is refused."""
    import signal
    import subprocess
    import uuid

    from launch_helpers import procs_with, worker

    from trainrun.supervisor import reaper

    token = f"swp{uuid.uuid4().hex[:8]}"
    code = ("import ctypes, os, subprocess, sys, time; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); "
            f"subprocess.Popen([sys.executable, {worker('escapees.py')!r}, {token!r}, 'sleep'], "
            "env={**os.environ, 'RANK': '0'}); time.sleep(120)")
    owner = subprocess.Popen([sys.executable, "-c", code, token])
    try:
        deadline = time.monotonic() + 90  # four interpreters starting: slow on a loaded 2-core box

        def settled() -> bool:
            # owner, rank and both escapees, and no transient: the rank's `sh -c` and forks carry the token too,
            # so a count of 4 alone once came before the daemon (a fresh-clone CI run)
            return (bool(procs_with(f"{token}-r0-setsid")) and bool(procs_with(f"{token}-r0-daemon"))
                    and len(procs_with(token)) == 4)

        while not settled() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(procs_with(token)) == 4
        os.kill(owner.pid, signal.SIGSTOP)
        me = reaper.stat(owner.pid)
        wrong = subprocess.run([sys.executable, "-m", "trainrun.supervisor.reaper", "nojob", "far", f"{owner.pid}:{me.start + 1}"],
                               capture_output=True, text=True, timeout=30)
        assert wrong.returncode == 0 and len(procs_with(token)) == 4  # not the process that started then: spared
        r = subprocess.run([sys.executable, "-m", "trainrun.supervisor.reaper", "nojob", "far", f"{owner.pid}:{me.start}"],
                           capture_output=True, text=True, timeout=30)
        assert (r.returncode, r.stdout.strip()) == (0, "clean")
        assert owner.wait(5) == -signal.SIGKILL
        assert procs_with(token) == []
    finally:
        owner.kill()
        owner.wait()
        for pid in procs_with(token):
            os.kill(pid, signal.SIGKILL)


def test_a_program_missing_on_the_agents_host_is_one_line_and_127_with_no_host_loss(tmp_path):
    """The agent reports its ranks could not start (FATAL frame, 127) and exits: that exit is no lost host.
    Before: 'lost the agent on far' and its ranks 'exited with code 255' followed as consequences, and the
    summary started a sweep of a host that had said goodbye."""
    import subprocess

    pipe_trainrun = os.path.join(os.path.dirname(__file__), "..", "elastic", "pipe_trainrun.py")
    p = subprocess.run([sys.executable, pipe_trainrun, "-H", "far:2", "no_such_train.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 127, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainrun: far: rank 0 on far: program no_such_train.py: no such file"), p.stderr
    assert "lost" not in p.stderr and "255" not in p.stderr and "new connection" not in p.stderr
