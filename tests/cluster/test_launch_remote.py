"""End to end on 3 simulated hosts: SSH fan-out through one agent per host, the env contract, output,
fail-fast, signals, launcher death, quoting, and an MPI world across hosts over the data network."""
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

HOSTS = ["h1", "h2", "h3"]


def trainrun(cluster, *args, cwd, timeout=120, **kw):
    argv = [sys.executable, "-m", "trainrun", "--ssh-config", str(cluster.ssh_config), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, **kw)


def job_procs(token: str) -> list[psutil.Process]:
    """Processes anywhere on the machine (all namespaces share the PID namespace) whose argv has `token`."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if token in " ".join(p.info["cmdline"] or ()) and p.pid != os.getpid():
            out.append(p)
    return out


def wait_gone(token: str, seconds: float = 10.0) -> list:
    deadline = time.monotonic() + seconds
    while (left := job_procs(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def by_rank(stdout: str) -> dict[int, str]:
    out = {}
    for line in stdout.splitlines():
        tag, _, text = line.partition("<stdout>:")
        out[int(tag.strip("[]"))] = text
    return out


def test_six_ranks_on_three_hosts(cluster, tmp_path):
    code = ("import os, socket; e = os.environ; print(e['RANK'], e['LOCAL_RANK'], e['NODE_RANK'], e['WORLD_SIZE'], "
            "e['TRAINRUN_CROSS_RANK'], socket.gethostname(), e['MASTER_ADDR'], os.getcwd())")
    r = trainrun(cluster, "-np", "6", "--hostfile", str(cluster.hostfile), "python", "-c", code, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ranks = by_rank(r.stdout)
    assert sorted(ranks) == list(range(6))
    for rank, text in ranks.items():
        rk, local, node, size, cross, host, master, cwd = text.split()
        assert (int(rk), int(local), int(node), int(size), int(cross)) == (rank, rank % 2, rank // 2, 6, rank // 2)
        assert host == HOSTS[rank // 2] and cwd == str(tmp_path)
        assert master == "10.241.0.2"  # rank 0's host as SSH reached it, not a name others may not resolve


def test_exclude_leaves_a_host_out_of_a_real_launch(cluster, tmp_path):
    """--exclude parsed once (config.parse_config) and applied to --hostfile's hosts: h2 gets no rank and
    the ranks are renumbered over h1 and h3; a name not among the hosts is a usage error before any is reached."""
    code = "import os, socket; print(os.environ['RANK'], socket.gethostname())"
    r = trainrun(cluster, "--hostfile", str(cluster.hostfile), "--exclude", "h2", "python", "-c", code, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(by_rank(r.stdout).values()) == ["0 h1", "1 h1", "2 h3", "3 h3"]
    r = trainrun(cluster, "--hostfile", str(cluster.hostfile), "--exclude", "h9", "true", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("trainrun: error: --exclude h9: not among the job's hosts"), r.stderr


def test_arguments_arrive_intact(cluster, tmp_path):
    nasty = ["a b", "it's", '"q"', "x; touch /tmp/pwned-trainrun", "$(id)", "`id`", "tab\there", "ünïcode", "-np", "3"]
    code = "import sys, json; print(json.dumps(sys.argv[1:]))"
    r = trainrun(cluster, "-H", "root@h2:1", "python", "-c", code, *nasty, cwd=tmp_path)  # user@host too
    assert r.returncode == 0, r.stderr
    import json

    assert json.loads(r.stdout.split(":", 1)[1]) == nasty
    assert not os.path.exists("/tmp/pwned-trainrun")


def test_output_burst_arrives_complete(cluster, tmp_path):
    code = "import os; r = os.environ['RANK']; [print(f'{r} line {i} ' + 'x' * 100) for i in range(500)]"
    r = trainrun(cluster, "-np", "6", "--hostfile", str(cluster.hostfile), "python", "-c", code, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3000
    for rank in range(6):
        mine = [line for line in lines if line.startswith(f"[{rank}]<stdout>:")]
        assert mine == [f"[{rank}]<stdout>:{rank} line {i} " + "x" * 100 for i in range(500)]


def test_remote_rank_killed_ends_everything(cluster, tmp_path):
    token = f"tok{uuid.uuid4().hex[:8]}"
    code = ("import os, signal, time, sys; r = int(os.environ['RANK']); time.sleep(1.5); "
            "os.kill(os.getpid(), signal.SIGKILL) if r == 3 else time.sleep(120)")
    t0 = time.monotonic()
    r = trainrun(cluster, "-np", "6", "--hostfile", str(cluster.hostfile), "python", "-c", code, token, cwd=tmp_path)
    assert r.returncode == 137, r.stderr
    assert "rank 3 on h2 (local rank 1) was killed by SIGKILL" in r.stderr
    assert time.monotonic() - t0 < 30
    assert wait_gone(token) == []


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGKILL, -9)])
def test_launcher_signals_reach_every_host(cluster, tmp_path, sig, code):
    token = f"tok{uuid.uuid4().hex[:8]}"
    prog = "import time, os; print('up', flush=True); time.sleep(120)"
    argv = [sys.executable, "-m", "trainrun", "--ssh-config", str(cluster.ssh_config), "-np", "6",
            "--hostfile", str(cluster.hostfile), "python", "-c", prog, token]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        for _ in range(6):  # every rank is up on its host
            assert b"up" in p.stdout.readline()
        assert len(job_procs(token)) >= 6
        p.send_signal(sig)
        assert p.wait(30) == code
    finally:
        p.kill()
        p.wait()
    assert wait_gone(token, 15) == []


def test_unreachable_host_is_a_host_error(cluster, tmp_path):
    cluster.stop_sshd(3)
    try:
        r = trainrun(cluster, "-H", "h1:1,h3:1", "true", cwd=tmp_path, timeout=60)
    finally:
        cluster.start_sshd(3)
    assert r.returncode == 3
    assert "h3: tcp: connection to 10.241.0.4:22 refused" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_mpi_world_across_hosts_uses_the_data_network(cluster, tmp_path):
    """UCX over TCP pinned to eth1: the allreduce's bytes must cross eth1 of every host."""
    def eth1_bytes():
        return [int(cluster.run(i, ["cat", "/sys/class/net/eth1/statistics/tx_bytes"]).stdout) for i in (1, 2, 3)]

    code = ("from mpi4py import MPI; import numpy as np; c = MPI.COMM_WORLD; a = np.full(4 << 20, c.rank + 1.0, np.float32); "
            "b = np.empty_like(a); c.Allreduce(a, b); print(c.size, float(b[0]), float(b[-1]), "
            "c.Split_type(MPI.COMM_TYPE_SHARED).size)")
    before = eth1_bytes()
    r = trainrun(cluster, "-np", "6", "--hostfile", str(cluster.hostfile), "-x", "UCX_TLS=tcp,self",
                 "-x", "UCX_NET_DEVICES=eth1", sys.executable, "-c", code, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert set(by_rank(r.stdout).values()) == {"6 21.0 21.0 2"}
    moved = [a - b for a, b in zip(eth1_bytes(), before)]
    assert all(m > 4 << 20 for m in moved), moved  # most of the 16 MiB buffers crossed eth1 of every host


def test_this_machine_and_a_remote_host_in_one_job(cluster, tmp_path):
    """The launcher plays the agent for its own host: one MPI world across it and h1; MASTER_ADDR is this
    machine's address on the route to h1, which h1 can reach."""
    code = ("from mpi4py import MPI; import os, socket; c = MPI.COMM_WORLD; "
            "print(c.size, c.rank, c.allreduce(c.rank + 1), os.environ['NODE_RANK'], os.environ['MASTER_ADDR'], socket.gethostname())")
    r = trainrun(cluster, "-H", "localhost:1,h1:1", sys.executable, "-c", code, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ranks = by_rank(r.stdout)
    assert ranks[0].split()[:5] == ["2", "0", "3", "0", "10.241.0.1"]
    assert ranks[1].split() == ["2", "1", "3", "1", "10.241.0.1", "h1"]
