"""A node dies mid-job: `docker kill` one container while 6 ranks (one MPI world, launched by trainrun from
the host) sleep. The launcher must fail fast (exit 255 = host lost), name the host, and leave no process of
the job on the host or in the surviving containers; `down` then removes the dead node too. And a node that
drops off the network (no RST: the host is alive but unreachable) must fail the job too, in bounded time.

Each test destroys a node, so each gets a fresh cluster (warm `up`: ~5-10 s); tests/docker/test_cluster.py's
shared cluster stays whole."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(600)]

N, SLOTS = 3, 2
NAME = f"pytest-kill-{os.getpid()}"
VICTIM = "node2"  # holds neither rank 0 nor the last ranks: the launcher must notice a middle host too
FAIL_FAST_S = 10.0
HEARTBEAT_S = 4.0  # --heartbeat-timeout for the partition test
PARTITION_DETECT_S = 30.0  # a heartbeat every few seconds, a few missed: well inside this

SLEEPER = """
import socket, sys, time
from mpi4py import MPI
c = MPI.COMM_WORLD
local = c.Split_type(MPI.COMM_TYPE_SHARED)
print("READY", c.rank, c.size, local.size, socket.gethostname(), flush=True)
time.sleep(600)
"""


@pytest.fixture
def fresh_cluster(engine, cc, tmp_path):
    state = tmp_path / NAME
    t0 = time.monotonic()
    info = cc.up(N, name=NAME, state_dir=state, slots=SLOTS)
    print(f"\nup {N} nodes (fresh cluster): {time.monotonic() - t0:.1f} s")
    yield info
    cc.down(NAME, state)
    assert cc.leftovers(cc.project_name(NAME)) == {"containers": [], "networks": [], "volumes": []}


def _host_pids_with(token: str) -> list[str]:
    """`pid cmdline` of processes on this machine whose argv contains token."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and d.name != str(os.getpid()):
            try:
                argv = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if token in argv:
                found.append(f"{d.name} {argv[:200]}")
    return found


def _container_procs(container: str) -> list[str]:
    """Processes in a container other than its init, the sshd listener and our own `ps`."""
    r = subprocess.run(["docker", "exec", container, "ps", "-eo", "pid=,args="], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    rest = []
    for line in r.stdout.splitlines():
        pid, _, args = line.strip().partition(" ")
        if pid == "1" or "[listener]" in args or args.startswith("ps -eo"):
            continue
        rest.append(line.strip())
    return rest


class SleepingJob:
    """6 ranks of SLEEPER launched by trainrun from the host, output pumped by a thread. `token` marks every
    rank's argv, so what is left of the job can be found by `ps` here and in the containers."""

    def __init__(self, info, trainrun_cmd, env, *extra):
        self.info = info
        self.token = f"trainrun-kill-test-{uuid.uuid4().hex[:12]}"
        argv = trainrun_cmd(info, "-np", str(N * SLOTS), "--grace", "2", *extra, "python3", "-c", SLEEPER, self.token)
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/tmp",
                                  env=env, start_new_session=True)
        self.lines: list[str] = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        for ln in self.p.stdout:
            self.lines.append(ln)
            if sum("READY" in x for x in self.lines) == N * SLOTS:
                self._ready.set()

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def wait_ready(self) -> None:
        """All 6 ranks in one MPI world, 2 per node, and their processes visible in the containers."""
        assert self._ready.wait(120), "ranks did not all start:\n" + self.out
        rows = [ln.split("READY", 1)[1].split() for ln in self.lines if "READY" in ln]
        assert all(int(r[1]) == N * SLOTS and int(r[2]) == SLOTS for r in rows), rows
        assert sorted(r[3] for r in rows) == sorted([nd.name for nd in self.info.nodes] * SLOTS)
        for nd in self.info.nodes:
            assert sum(self.token in x for x in _container_procs(nd.container)) >= SLOTS, nd.name

    def wait_exit(self, timeout: float) -> int | None:
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self._reader.join(10)
        return rc

    def assert_nothing_left(self, survivors, within: float = 15) -> None:
        """No process of the job here (launcher, local helpers; the containers' processes show here too) nor
        in `survivors` (agent, ranks, their sshd sessions). The agents kill their ranks when the channel
        drops: allow --grace + slack; a cut-off agent only after its patience (--heartbeat-timeout)."""
        deadline = time.monotonic() + within
        while True:
            here = _host_pids_with(self.token)
            there = {nd.name: _container_procs(nd.container) for nd in survivors}
            if not here and not any(there.values()):
                return
            if time.monotonic() > deadline:
                pytest.fail(f"left behind after the launcher exited: host {here}, containers {there}")
            time.sleep(0.5)

    def kill(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()


LOST = r"(lost the agent on|no word from the agent on) {}\b"  # connection closed / host silent


def _summary_names(out: str, victim: str) -> None:
    summary = [ln for ln in out.splitlines() if ln.startswith("trainrun:")]
    assert any(re.search(LOST.format(victim), ln) for ln in summary), out
    others = {f"node{i}" for i in range(1, N + 1)} - {victim}
    assert not any(re.search(LOST.format(o), ln) for o in others for ln in summary), out


def test_killed_node_fails_the_job_fast_and_is_named(fresh_cluster, trainrun_cmd, trainrun_env, cc):
    info = fresh_cluster
    victim = next(nd for nd in info.nodes if nd.name == VICTIM)
    survivors = [nd for nd in info.nodes if nd.name != VICTIM]
    job = SleepingJob(info, trainrun_cmd, trainrun_env)
    try:
        job.wait_ready()
        t_kill = time.monotonic()
        subprocess.run(["docker", "kill", victim.container], check=True, capture_output=True, timeout=30)
        rc = job.wait_exit(60)
        took = time.monotonic() - t_kill
        assert rc is not None, f"launcher still running 60 s after `docker kill {VICTIM}`:\n{job.out}"
        print(f"launcher exit {rc} {took:.2f} s after docker kill {VICTIM}")
        assert rc == 255, f"exit {rc}, expected 255 (host lost):\n{job.out}"
        assert took < FAIL_FAST_S, f"launcher took {took:.1f} s to notice the dead host:\n{job.out}"
        _summary_names(job.out, VICTIM)
        job.assert_nothing_left(survivors)
        state = subprocess.run(["docker", "inspect", "-f", "{{.State.Status}}", victim.container],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        assert state == "exited"

        # and `--check` now fails, naming the dead node and only that one
        r = subprocess.run(trainrun_cmd(info, "--check", "--json", "--ssh-timeout", "3"), capture_output=True,
                           text=True, timeout=120, cwd="/tmp", env=trainrun_env)
        assert r.returncode != 0, r.stdout + r.stderr
        d = json.loads(r.stdout)
        assert d["ok"] is False and [h["host"] for h in d["hosts"] if not h["ok"]] == [VICTIM], d["hosts"]
        assert any(VICTIM in p for p in d["problems"]), d["problems"]
    finally:
        job.kill()

    # down removes the dead node as well
    cc.down(NAME, info.state_dir)
    assert cc.leftovers(cc.project_name(NAME)) == {"containers": [], "networks": [], "volumes": []}
    assert not Path(info.state_dir).exists()


def test_partitioned_node_fails_the_job(fresh_cluster, trainrun_cmd, trainrun_env):
    """node3 loses its mgmt NIC (the launcher's SSH path) mid-job: nothing is closed, packets just vanish.
    The launcher must still end the job with 255 naming node3 within PARTITION_DETECT_S."""
    info = fresh_cluster
    victim = info.nodes[-1]
    job = SleepingJob(info, trainrun_cmd, trainrun_env, "--heartbeat-timeout", str(HEARTBEAT_S))
    try:
        job.wait_ready()
        t0 = time.monotonic()
        subprocess.run(["docker", "network", "disconnect", "-f", f"{info.project}_mgmt", victim.container],
                       check=True, capture_output=True, timeout=30)
        rc = job.wait_exit(PARTITION_DETECT_S)
        took = time.monotonic() - t0
        assert rc is not None, (f"launcher still running {took:.0f} s after {victim.name} dropped off the "
                                f"network:\n{job.out}")
        assert rc == 255, job.out
        _summary_names(job.out, victim.name)
        # the cut-off node cleans up by itself: its agent hears nothing for HEARTBEAT_S (its patience)
        job.assert_nothing_left([nd for nd in info.nodes if nd is not victim], within=4 * HEARTBEAT_S + 15)
    finally:
        job.kill()
