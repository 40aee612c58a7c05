"""mpi4py programs under `trainrun -np N` with the default MPI world (trainrun as MPICH's process manager)."""
import glob
import subprocess
import sys
import time
from pathlib import Path

import psutil

HERE = Path(__file__).parent / "mpi"


def trainrun(*args, timeout=120, **kw):
    return subprocess.run([sys.executable, "-m", "trainrun", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **kw)


def shm_segments():
    return set(glob.glob("/dev/shm/mpich_shm_*")) | set(glob.glob("/dev/shm/mpich_vci_*"))


def test_collectives_on_four_ranks():
    r = trainrun("-np", 4, "--prefix", "none", sys.executable, HERE / "collectives.py")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split("\n")[:-1]) == [f"ok 4 {i} 4" for i in range(4)]


def test_local_ranks_see_each_other_as_local():
    r = trainrun("-H", "localhost:2,127.0.0.1:2", "--prefix", "none", sys.executable, HERE / "collectives.py")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split("\n")[:-1]) == [f"ok 4 {i} 2" for i in range(4)]  # 2 "nodes" x 2


def test_mpi_abort_ends_the_job_with_its_code(tmp_path):
    before = shm_segments()
    code = ("from mpi4py import MPI; import os, time; c = MPI.COMM_WORLD; "
            "open(f'pid{c.rank}', 'w').write(str(os.getpid())); c.Barrier(); "
            "c.Abort(3) if c.rank == 2 else time.sleep(60)")
    t0 = time.monotonic()
    r = trainrun("-np", 4, sys.executable, "-c", code, cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert "rank 2 on localhost (local rank 2) called MPI_Abort with code 3" in r.stderr
    assert time.monotonic() - t0 < 30
    for i in range(4):
        assert not psutil.pid_exists(int((tmp_path / f"pid{i}").read_text()))
    assert shm_segments() - before == set()


def test_killed_rank_ends_the_job_and_its_shm_is_removed(tmp_path):
    before = shm_segments()
    code = ("from mpi4py import MPI; import numpy as np, os, signal, time; c = MPI.COMM_WORLD; "
            "c.Allreduce(np.ones(1 << 20), np.empty(1 << 20)); c.Barrier(); "
            "os.kill(os.getpid(), signal.SIGKILL) if c.rank == 1 else c.Barrier()")
    r = trainrun("-np", 3, sys.executable, "-c", code, cwd=tmp_path)
    assert r.returncode == 137 and "rank 1 on localhost (local rank 1) was killed by SIGKILL" in r.stderr
    assert shm_segments() - before == set()


def test_rank_that_never_joins_is_reported(tmp_path):
    code = ("import os, sys; sys.exit(0) if os.environ['RANK'] == '1' else None; "
            "from mpi4py import MPI; MPI.COMM_WORLD.Barrier()")
    r = trainrun("-np", 2, "--start-timeout", 3, sys.executable, "-c", code, cwd=tmp_path)
    assert r.returncode == 124, r.stderr
    assert "rank(s) 1 did not join the MPI world within --start-timeout 3s" in r.stderr


def test_the_world_opens_no_listening_socket(tmp_path):
    """Nothing outside the job can join it or read its KVS: the PMI plane is socket pairs only."""
    code = "from mpi4py import MPI; import time; MPI.COMM_WORLD.Barrier(); print('in', flush=True); time.sleep(3)"
    p = subprocess.Popen([sys.executable, "-m", "trainrun", "-np", "2", sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        assert b"in" in p.stdout.readline()
        launcher = psutil.Process(p.pid)
        listening = [c for c in launcher.net_connections(kind="all") if c.status == psutil.CONN_LISTEN]
        assert listening == []
        unix = [c for c in launcher.net_connections(kind="unix") if c.laddr]
        assert unix == []  # no named unix sockets either
    finally:
        p.wait(30)
    assert p.returncode == 0
