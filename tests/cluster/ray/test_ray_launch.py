"""`trainrun --ray` on a real 3-node Ray cluster (tests/cluster/ray/conftest.py): placement, the env contract,
output, failures, and nothing left on any node after success, failure, Ctrl-C or a SIGKILLed launcher."""
from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from tests.cluster.ray.conftest import wait_nothing_left

REPO = Path(__file__).parents[3]
TRAINRUN = [sys.executable, "-m", "trainrun"]
SHOW = ("import os, socket; e = os.environ; print('at', e['RANK'], e['LOCAL_RANK'], e['LOCAL_WORLD_SIZE'], e['WORLD_SIZE'], "
        "socket.gethostname(), repr(e.get('CUDA_VISIBLE_DEVICES')), "
        "any(k.startswith('RAY_') for k in e), flush=True)")


def test_places_six_ranks_on_three_nodes_with_the_env_contract(ray_cluster):
    p = ray_cluster.run(1, [*TRAINRUN, "--ray", "-np", "6", sys.executable, "-c", SHOW], cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = sorted(line.split(":", 1)[1].split()[1:] for line in p.stdout.splitlines() if ":at " in line)
    assert [r[0] for r in sorted(rows, key=lambda r: int(r[0]))] == [str(i) for i in range(6)], p.stdout
    by_host: dict[str, list[str]] = {}
    for rank, local, local_size, size, host, cuda, ray_vars in rows:
        assert size == "6" and local_size == "2", rows
        assert cuda == "''", f"rank {rank}: Ray granted no GPU, yet CUDA_VISIBLE_DEVICES={cuda}"
        assert ray_vars == "False", f"rank {rank} sees Ray's worker variables"
        by_host.setdefault(host, []).append(local)
    assert {h: sorted(v) for h, v in by_host.items()} == {"h1": ["0", "1"], "h2": ["0", "1"], "h3": ["0", "1"]}
    assert all(line.startswith(f"[{line[1]}]") for line in p.stdout.splitlines() if ":at " in line)
    wait_nothing_left(ray_cluster)


def test_trains_the_torch_example(ray_cluster):
    p = ray_cluster.run(1, [*TRAINRUN, "--ray", "-np", "6", sys.executable, "examples/train_torch.py", "--epochs",
                            "1"], cwd=REPO, timeout=300)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    assert "[0]" in p.stdout
    wait_nothing_left(ray_cluster)


SLEEP = "import time, os; print('up', os.environ['RANK'], flush=True); time.sleep(120)"


def _wait_for_lines(proc, marker: str, count: int, timeout: float = 90.0) -> list[str]:
    """Lines of `proc`'s stdout until `count` of them contain `marker`."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while sum(marker in line for line in seen) < count:
        assert time.monotonic() < deadline, f"no {count} x {marker!r} in {timeout} s: {seen}"
        line = proc.stdout.readline()
        assert line, f"launcher ended early: {seen}"
        seen.append(line)
    return seen


def test_a_failing_rank_fails_the_job_fast(ray_cluster):
    fail = "import os, sys, time; r = int(os.environ['RANK']); time.sleep(0 if r == 4 else 60); sys.exit(3)"
    started = time.monotonic()
    p = ray_cluster.run(1, [*TRAINRUN, "--ray", "-np", "6", sys.executable, "-c", fail], cwd=REPO)
    assert p.returncode == 3, p.stderr[-3000:]
    assert time.monotonic() - started < 45
    assert "rank 4 on" in p.stderr and "exited with code 3" in p.stderr, p.stderr
    wait_nothing_left(ray_cluster)


def test_ctrl_c_ends_the_job_and_leaves_nothing(ray_cluster):
    import subprocess

    proc = ray_cluster.popen(1, [*TRAINRUN, "--ray", "-np", "6", sys.executable, "-c", SLEEP], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_lines(proc, "up", 6)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_nothing_left(ray_cluster)


def test_a_sigkilled_launcher_leaves_nothing_on_any_node(ray_cluster):
    """Ray's owner rule (the actors and the placement group die with their driver) and the agents' EOF rule."""
    import subprocess

    proc = ray_cluster.popen(1, [*TRAINRUN, "--ray", "-np", "6", sys.executable, "-c", SLEEP], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        _wait_for_lines(proc, "up", 6)
        proc.kill()  # nsenter execs the launcher: this is the launcher's pid
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_nothing_left(ray_cluster, timeout=60)


def test_run_api_returns_every_ranks_value(ray_cluster):
    code = ("import trainrun, os\n"
            "def f(x):\n"
            "    return (int(os.environ['RANK']), x * 2)\n"
            "print(trainrun.run(f, args=(21,), np=4, ray='auto'))\n")
    p = ray_cluster.run(1, [sys.executable, "-c", code], cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == str([(r, 42) for r in range(4)])
    wait_nothing_left(ray_cluster)


def test_a_killed_raylet_ends_the_job_naming_the_node(ray_cluster):
    """Runs last in this file: h3's node is started again afterwards (restart_node)."""
    import subprocess

    proc = ray_cluster.popen(1, [*TRAINRUN, "--ray", "-np", "6", sys.executable, "-c", SLEEP], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_lines(proc, "up", 6)
        killed = time.monotonic()
        import os

        os.kill(ray_cluster.raylet(3), signal.SIGKILL)
        err = proc.stderr.read()
        code = proc.wait(90)
        assert code != 0, err
        assert time.monotonic() - killed < 60, err
        assert "10.241.0.4" in err, err  # h3's node, named
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ray_cluster.restart_node(3)
    wait_nothing_left(ray_cluster, timeout=60)


def test_elastic_a_killed_raylet_resumes_on_the_nodes_left(ray_cluster):
    """--min-np: the lost node's ranks are not replaced on it; the next attempt runs on the other two nodes."""
    import os
    import subprocess

    prog = ("import os, time; c = os.environ['TRAINRUN_RESTART_COUNT']; "
            "print('up', os.environ['RANK'], c, os.environ['WORLD_SIZE'], flush=True); "
            "time.sleep(120 if c == '0' else 0)")
    proc = ray_cluster.popen(1, [*TRAINRUN, "--ray", "-np", "6", "--min-np", "2", sys.executable, "-c", prog],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_lines(proc, "up", 6)
        os.kill(ray_cluster.raylet(3), signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        again = [line.split(":", 1)[1].split() for line in out.splitlines() if ":up " in line]
        assert sorted(r[1] for r in again if r[2] == "1") == ["0", "1", "2", "3"], (out, err)
        assert {r[3] for r in again if r[2] == "1"} == {"4"}, out
        assert "10.241.0.4" in err, err  # the lost node, named
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ray_cluster.restart_node(3)
    wait_nothing_left(ray_cluster, timeout=60)


def test_hang_timeout_takes_every_ranks_stack_through_the_agents(ray_cluster):
    p = ray_cluster.run(1, [*TRAINRUN, "--ray", "-np", "6", "--hang-timeout", "5", sys.executable, "-c", SLEEP],
                        cwd=REPO, timeout=120)
    assert p.returncode == 124, p.stderr[-3000:]
    assert "stacks of 6 rank(s)" in p.stderr and "ranks 0-5: <module> (<string>:1)" in p.stderr, p.stderr[-3000:]
    wait_nothing_left(ray_cluster)


ELASTIC_IDLE = """
import time
import trainrun.torch as hvd

hvd.init()
state = hvd.elastic.ObjectState(step=0)


@hvd.elastic.run
def train(state):
    if hvd.rank() == 0:
        print(f"attempt {hvd.elastic.restart_count()}: {hvd.size()} ranks", flush=True)
    while True:
        time.sleep(0.2)
        state.step += 1
        state.commit()


train(state)
"""


def test_elastic_a_node_that_joins_again_brings_the_job_back_to_full_size(ray_cluster, tmp_path):
    """h3's raylet killed: the job goes on as 4 ranks; h3's node started again: Ray places the group's two lost
    bundles there, the engine's discovery (the placement group) sees it, and after its cool-down the ranks reset
    at a commit onto 6 ranks again."""
    import os
    import subprocess

    prog = tmp_path / "elastic_idle.py"  # an elastic program that mostly sleeps: a node must start meanwhile
    prog.write_text(ELASTIC_IDLE)
    proc = ray_cluster.popen(1, [*TRAINRUN, "--ray", "-np", "6", "--min-np", "2", "--blacklist-cooldown-range", "1", "2",
                                 sys.executable, prog],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=(tmp_path / "err").open("w"), text=True)
    try:
        _wait_for_lines(proc, ": 6 ranks", 1, timeout=120)
        os.kill(ray_cluster.raylet(3), signal.SIGKILL)
        _wait_for_lines(proc, ": 4 ranks", 1, timeout=120)
        ray_cluster.restart_node(3)
        _wait_for_lines(proc, ": 6 ranks", 1, timeout=120)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        err = (tmp_path / "err").read_text()
        assert proc.returncode == 130, err
        assert "10.241.0.4" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_nothing_left(ray_cluster, timeout=60)


def test_a_ray_client_address_from_off_the_cluster(ray_cluster):
    """The launcher outside every node (the root namespace), through Ray's client server on the head."""
    import subprocess

    head = ray_cluster.address.split(":")[0]
    p = subprocess.run([*TRAINRUN, "--ray", f"ray://{head}:10001", "-np", "6", sys.executable, "-c", SHOW], cwd=REPO,
                       env=ray_cluster.env(), capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    hosts = sorted(line.split()[5] for line in p.stdout.splitlines() if ":at " in line)
    assert hosts == ["h1", "h1", "h2", "h2", "h3", "h3"], p.stdout
    wait_nothing_left(ray_cluster)


def test_strict_spread_puts_one_rank_on_each_node(ray_cluster):
    p = ray_cluster.run(1, [*TRAINRUN, "--ray", "-np", "3", "--ray-strategy", "strict_spread", "--cpus-per-proc", "0.5",
                            sys.executable, "-c", SHOW], cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [line.split()[1:] for line in p.stdout.splitlines() if ":at " in line]
    assert sorted(r[4] for r in rows) == ["h1", "h2", "h3"] and {r[2] for r in rows} == {"1"}, p.stdout
    wait_nothing_left(ray_cluster)


def test_gpus_per_proc_pins_each_rank_to_a_gpu_ray_assigned(ray_cluster):
    """The test nodes declare 2 GPUs each to Ray, with a stand-in nvidia-smi (scripts/ray_testbed.py)."""
    p = ray_cluster.run(1, [*TRAINRUN, "--ray", "-np", "6", "--gpus-per-proc", "1", sys.executable, "-c", SHOW],
                        cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [line.split()[1:] for line in p.stdout.splitlines() if ":at " in line]
    by_host: dict[str, list[str]] = {}
    for r in rows:
        by_host.setdefault(r[4], []).append(r[5])
    assert {h: sorted(v) for h, v in by_host.items()} == {h: ["'0'", "'1'"] for h in ("h1", "h2", "h3")}, p.stdout
    wait_nothing_left(ray_cluster)


def test_nics_probed_through_the_nodes_actors_and_mpi_forms(ray_cluster):
    """--no-cache: the NIC probe's modules run under each node's actor; the ranks get the NICs every node can
    reach every other on (not h2's dead-end eth2, not the docker0 decoy), and MPI forms its world over them."""
    code = ("import os; from mpi4py import MPI; c = MPI.COMM_WORLD; "
            "print(c.size, c.allreduce(1), os.environ.get('UCX_NET_DEVICES'))")
    p = ray_cluster.run(1, [*TRAINRUN, "--ray", "-np", "3", "--ray-strategy", "strict_spread", "--no-cache",
                            sys.executable, "-c", code], cwd=REPO, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [line.split(":", 1)[1] for line in p.stdout.splitlines() if line.startswith("[")]
    assert lines == ["3 3 eth0,eth1"] * 3, p.stdout
    wait_nothing_left(ray_cluster)


def test_elastic_a_lost_nodes_ranks_are_replaced_on_the_nodes_ray_has(ray_cluster, tmp_path):
    """Half a CPU per rank: 6 ranks fit on two nodes and leave room on the third. A node with ranks (not h1,
    the launcher's) loses its raylet: Ray places its bundles again where there is room, and the job is back
    to 6 ranks without that node."""
    import os
    import subprocess

    prog = tmp_path / "elastic_idle.py"
    prog.write_text(ELASTIC_IDLE.replace("{hvd.size()} ranks", "{hvd.size()} ranks on {__import__('socket').gethostname()}"))
    proc = ray_cluster.popen(1, [*TRAINRUN, "--ray", "-np", "6", "--min-np", "2", "--cpus-per-proc", "0.5",
                                 sys.executable, prog], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=(tmp_path / "err").open("w"), text=True)
    victim = None
    try:
        _wait_for_lines(proc, ": 6 ranks", 1, timeout=120)
        ranks = ray_cluster.processes_with_env("TRAINRUN_JOB_ID=")
        victim = next(i for i in (2, 3) if ranks.get(i))
        os.kill(ray_cluster.raylet(victim), signal.SIGKILL)
        seen = _wait_for_lines(proc, "attempt", 1, timeout=120)
        while ": 6 ranks" not in seen[-1]:
            seen += _wait_for_lines(proc, "attempt", 1, timeout=120)
        assert "attempt 0" not in seen[-1], seen
        deadline = time.monotonic() + 30  # the lost node's old ranks end once its Ray worker sees the raylet gone
        while ray_cluster.processes_with_env("TRAINRUN_JOB_ID=").get(victim):
            assert time.monotonic() < deadline, "ranks left on the lost node"
            time.sleep(0.5)
        assert sum(map(len, ray_cluster.processes_with_env("TRAINRUN_JOB_ID=").values())) >= 6
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        err = (tmp_path / "err").read_text()
        assert proc.returncode == 130, err
        assert ray_cluster.tb.host(victim).mgmt_ip in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if victim is not None:
            ray_cluster.restart_node(victim)
    wait_nothing_left(ray_cluster, timeout=60)
