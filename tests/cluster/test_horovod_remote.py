"""`import horovod` on simulated remote hosts (issue 28 item 1): the agent that starts the ranks on each host puts
that host's trainrun `horovod` shim first on their PYTHONPATH (the launcher's PYTHONPATH does not carry it), and
`--horovod installed` travels with the job; HOROVOD_* tuning reaches the remote ranks' runtime."""
import subprocess
import sys

from trainrun.plan.horovod_shim import SHIM_DIR

CODE = ("import os, socket, horovod, horovod.common.util as u; "
        "print('HOROVOD', socket.gethostname(), horovod.__file__ if u.mpi_built() else '-', flush=True)")


def launch(cluster, *options, timeout=120):
    argv = [sys.executable, "-m", "trainrun", "--ssh-config", str(cluster.ssh_config), "-H", "h1:1,h2:1", "--mpi", "none",
            *options, sys.executable, "-c", CODE]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def test_remote_ranks_import_trainruns_horovod(cluster):
    proc = launch(cluster)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = sorted(line.split("HOROVOD ", 1)[1] for line in proc.stdout.splitlines() if "HOROVOD " in line)
    assert rows == [f"h1 {SHIM_DIR}/horovod/__init__.py", f"h2 {SHIM_DIR}/horovod/__init__.py"], proc.stdout


def test_remote_ranks_without_the_shim_on_request(cluster):
    proc = launch(cluster, "--horovod", "installed")
    assert proc.returncode != 0 and "No module named 'horovod'" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_slurm_ranks_import_trainruns_horovod(slurm, tmp_path):
    """Inside an allocation the agents run in srun steps and start the ranks: the shim is on their path too."""
    try:
        p = slurm.run(1, ["salloc", "-N2", "--ntasks-per-node=1", sys.executable, "-m", "trainrun", "--prefix", "none",
                          "--mpi", "none", sys.executable, "-c", CODE], cwd=tmp_path, timeout=120)
    finally:
        left = slurm.cancel_all()
    assert p.returncode == 0, p.stdout + p.stderr
    rows = sorted(line.split("HOROVOD ", 1)[1] for line in p.stdout.splitlines() if "HOROVOD " in line)
    assert rows == [f"h1 {SHIM_DIR}/horovod/__init__.py", f"h2 {SHIM_DIR}/horovod/__init__.py"], p.stdout
    assert left == []
