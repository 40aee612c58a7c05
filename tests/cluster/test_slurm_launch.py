"""trainrun inside a real Slurm allocation (the `slurm` fixture: slurmctld + munged + one slurmd per simulated host):
hosts, slots and -np from the allocation, agents through srun steps (no SSH), one MPI world, fail-fast, and nothing
left after scancel or a SIGKILLed launcher. Everything starts from h1, the login node."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

TRAINRUN = [sys.executable, "-m", "trainrun"]
WORLD = ("import os, socket; from mpi4py import MPI; c = MPI.COMM_WORLD; e = os.environ\n"
         "print('ROW', socket.gethostname(), c.rank, c.size, c.allreduce(c.rank), e['RANK'], e['LOCAL_RANK'], e['NODE_RANK'],"
         " e['NNODES'], e['SLURM_PROCID'], e['SLURM_NODEID'], e['SLURM_LOCALID'], e['MASTER_ADDR'], flush=True)\n")
MARK = "trainrun-slurm-test-mark"


@pytest.fixture
def jobs_cancelled(slurm):
    yield
    assert slurm.cancel_all() == []


def leftovers(cluster, pattern: str = MARK) -> dict[int, str]:
    """{host: pgrep output} of processes whose command line holds `pattern`, on every host."""
    out = {}
    for i in (1, 2, 3):
        p = cluster.run(i, ["pgrep", "-af", pattern], capture_output=True, text=True)
        lines = [ln for ln in p.stdout.splitlines() if "pgrep" not in ln]
        if lines:
            out[i] = "\n".join(lines)
    return out


def wait_until_clean(cluster, within: float) -> dict[int, str]:
    deadline = time.monotonic() + within
    while (left := leftovers(cluster)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_salloc_runs_one_world_through_srun_without_ssh(slurm, cluster, tmp_path, jobs_cancelled):
    """`salloc -N3 --ntasks-per-node=2 trainrun python -c ...` with every sshd stopped: 6 ranks, 2 per host, the env
    contract (and Slurm's own rank variables set to it), one MPI world."""
    for i in (1, 2, 3):
        cluster.stop_sshd(i)
    try:
        p = slurm.run(1, ["salloc", "-N3", "--ntasks-per-node=2", *TRAINRUN, "--prefix", "none", sys.executable, "-c", WORLD],
                      cwd=tmp_path, timeout=120)
    finally:
        for i in (1, 2, 3):
            cluster.start_sshd(i)
    assert p.returncode == 0, p.stderr
    rows = sorted(line.split()[1:] for line in p.stdout.splitlines() if line.startswith("ROW"))
    assert [(r[0], r[1]) for r in sorted(rows, key=lambda r: int(r[1]))] == [
        ("h1", "0"), ("h1", "1"), ("h2", "2"), ("h2", "3"), ("h3", "4"), ("h3", "5")]
    for host, rank, size, total, env_rank, local, node, nnodes, procid, nodeid, localid, master in rows:
        assert (size, total, env_rank, nnodes, procid) == ("6", "15", rank, "3", rank)
        assert (nodeid, localid) == (node, local) and int(node) == int(rank) // 2 and int(local) == int(rank) % 2
        assert master == cluster.host(1).mgmt_ip or master.startswith("10.")


def test_dry_run_says_where_the_hosts_come_from(slurm, tmp_path, jobs_cancelled):
    p = slurm.run(1, ["salloc", "-N2", *TRAINRUN, "--dry-run", "true"], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "hosts: Slurm job" in p.stdout and "reached through srun" in p.stdout and "engine: slurm" in p.stdout
    assert [line.split()[1] for line in p.stdout.splitlines() if line[:1].isdigit()] == ["h1", "h2"]


def test_check_in_an_allocation_goes_through_srun(slurm, cluster, tmp_path, jobs_cancelled):
    for i in (1, 2, 3):
        cluster.stop_sshd(i)
    try:
        p = slurm.run(1, ["salloc", "-N3", *TRAINRUN, "--check"], cwd=tmp_path, timeout=120)
    finally:
        for i in (1, 2, 3):
            cluster.start_sshd(i)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Hosts (Slurm job" in p.stdout and "verdict: OK, 3 rank(s) on 3 host(s)" in p.stdout
    assert "eth1" in p.stdout and "routable" in p.stdout


def test_sbatch_wait_returns_the_jobs_code_and_its_output_file_holds_rank_lines(slurm, tmp_path, jobs_cancelled):
    prog = ("import os, socket, sys, time; r = os.environ['RANK']\n"
            "print('hello from', socket.gethostname(), r, flush=True)\n"
            "open(f'done.{r}', 'w').close()\n"
            "t = time.monotonic() + 60\n"
            "while r == '1' and not all(os.path.exists(f'done.{i}') for i in (0, 2)) and time.monotonic() < t: time.sleep(0.05)\n"
            "sys.exit(3 if r == '1' else 0)\n")
    p = slurm.run(1, [*TRAINRUN, "--sbatch", "-N", "3", "--output=job-%j.out", "--wait", sys.executable, "-c", prog],
                  cwd=tmp_path, timeout=180)
    assert p.returncode == 3, p.stdout + p.stderr
    jid = p.stdout.split("submitted batch job ")[1].split()[0]
    out = (tmp_path / f"job-{jid}.out").read_text().splitlines()
    assert {"[0]<stdout>:hello from h1 0", "[1]<stdout>:hello from h2 1", "[2]<stdout>:hello from h3 2"} <= set(out)
    assert any("rank 1 on h2 (local rank 0) exited with code 3" in line for line in out)


def test_a_rank_failing_on_h2_ends_the_job_on_every_host(slurm, cluster, tmp_path, jobs_cancelled):
    prog = (f"import os, sys, time; r = os.environ['RANK']; mark = '{MARK}'\n"
            "open(f'up.{r}', 'w').close()\n"
            "t = time.monotonic() + 60\n"
            "while r == '1' and not all(os.path.exists(f'up.{i}') for i in range(3)) and time.monotonic() < t: time.sleep(0.05)\n"
            "sys.exit(7) if r == '1' else time.sleep(120)\n")
    p = slurm.run(1, ["salloc", "-N3", *TRAINRUN, "--grace", "1", sys.executable, "-c", prog, MARK], cwd=tmp_path,
                  timeout=120)
    assert p.returncode == 7, p.stderr
    assert "rank 1 on h2 (local rank 0) exited with code 7; stopped all 3 rank(s)" in p.stderr
    assert wait_until_clean(cluster, 10) == {}


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _start_job(slurm, tmp_path):
    prog = f"import os, time; open('up.' + os.environ['RANK'], 'w').close(); time.sleep(300)  # {MARK}"
    proc = slurm.popen(1, ["salloc", "-N3", *TRAINRUN, sys.executable, "-c", prog], cwd=tmp_path,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"up.{r}").exists() for r in range(3)):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate(timeout=5)
        time.sleep(0.1)
    return proc


def test_scancel_of_the_allocation_leaves_nothing_on_any_host(slurm, cluster, tmp_path, jobs_cancelled):
    proc = _start_job(slurm, tmp_path)
    try:
        jobs = slurm.jobs()
        assert len(jobs) == 1
        slurm.run(1, ["scancel", jobs[0]])
        assert wait_until_clean(cluster, 15) == {}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def test_a_sigkilled_launcher_leaves_nothing_within_seconds(slurm, cluster, tmp_path, jobs_cancelled):
    proc = _start_job(slurm, tmp_path)
    try:
        launcher = subprocess.run(["pgrep", "-f", "--", f"^{sys.executable} -m trainrun {sys.executable} -c"], capture_output=True, text=True)
        pids = {int(p) for p in launcher.stdout.split()}
        parents = [p for p in pids if _ppid(p) not in pids]  # not the launcher's forked watchdog
        assert len(parents) == 1, launcher.stdout
        os.kill(parents[0], signal.SIGKILL)
        assert wait_until_clean(cluster, 10) == {}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
