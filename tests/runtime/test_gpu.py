"""The GPU path on a machine with an NVIDIA GPU (skipped with "no GPU" elsewhere).

- NCCL at world size 1 (and one rank per GPU where there are several): every op and dtype on CUDA
  tensors against a float64 CPU reference, async, grouped, gradients, DistributedOptimizer training
  equal to single-process training (workers/gpu_ops.py).
- Two ranks sharing one GPU with --allow-gpu-sharing: the launcher sends CUDA collectives through host
  memory (TRAINRUN_GPU_OPERATIONS=mpi) and the same cases pass; forcing NCCL there is a clear error.
- --gpus-per-proc isolation, its refusal without --allow-gpu-sharing, and --check showing the GPU.
"""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.runtime.launch import check, run_cases

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")]

CASES = ["path_in_use", "allreduce_every_dtype_and_op", "pre_and_postscale", "async_many_and_grouped",
         "allgather_broadcast_every_dtype", "alltoall_every_dtype", "reducescatter_every_float_dtype",
         "gradients_on_gpu", "distributed_optimizer_equals_single_process"]
ENV = {"TRAINRUN_STALL_TIMEOUT": "60"}


def _clean_env(**more) -> dict:
    """The test's environment without a GPU-operations choice of its own, plus `more`."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRAINRUN_GPU_OPERATIONS", "HOROVOD_GPU_OPERATIONS")}
    return {**env, "OMP_NUM_THREADS": "1", **more}


@pytest.fixture(scope="module")
def nccl_one_rank(tmp_path_factory):
    from trainrun.runtime.backends import nccl
    if not nccl.available():
        pytest.fail("a GPU is here but libnccl.so.2 was not found (torch's CUDA build ships it)")
    return run_cases("gpu_ops", 1, tmp_path_factory.mktemp("gpu_nccl1"), timeout=300,
                     env={**ENV, "TRAINRUN_GPU_OPERATIONS": "nccl", "EXPECT_GPU_OPERATIONS": "nccl"})


@pytest.fixture(scope="module")
def nccl_rank_per_gpu(tmp_path_factory):
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip("one GPU: NCCL across ranks needs a GPU per rank")
    return run_cases("gpu_ops", n, tmp_path_factory.mktemp("gpu_nccln"), timeout=300,
                     env={**ENV, "TRAINRUN_GPU_OPERATIONS": "nccl", "EXPECT_GPU_OPERATIONS": "nccl"})


@pytest.fixture(scope="module")
def two_ranks_share_one_gpu(tmp_path_factory, monkeypatch_module):
    monkeypatch_module.delenv("TRAINRUN_GPU_OPERATIONS", raising=False)
    monkeypatch_module.delenv("HOROVOD_GPU_OPERATIONS", raising=False)
    return run_cases("gpu_ops", 2, tmp_path_factory.mktemp("gpu_shared"), timeout=300,
                     env={**ENV, "CUDA_VISIBLE_DEVICES": "0", "EXPECT_GPU_OPERATIONS": "mpi"},
                     hosts=["--allow-gpu-sharing"])


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.mark.parametrize("case", CASES)
def test_nccl_world_size_1(nccl_one_rank, case):
    check(nccl_one_rank, case)


@pytest.mark.parametrize("case", CASES)
def test_nccl_one_rank_per_gpu(nccl_rank_per_gpu, case):
    check(nccl_rank_per_gpu, case)


@pytest.mark.parametrize("case", CASES)
def test_two_ranks_share_one_gpu_through_host_memory(two_ranks_share_one_gpu, case):
    check(two_ranks_share_one_gpu, case)


def _launch(args, tmp_path, script: str, env=None, timeout=120) -> subprocess.CompletedProcess:
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(script))
    return subprocess.run([sys.executable, "-m", "trainrun", *args, sys.executable, str(prog)], env=env or _clean_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_nccl_refuses_two_ranks_on_one_gpu_clearly(tmp_path):
    """NCCL cannot put two ranks on one GPU: every rank fails at its first CUDA collective with a message
    naming the ranks and the fix, and the job ends (no hang)."""
    proc = _launch(["-np", "2"], tmp_path, """
        import torch, trainrun.torch as hvd
        hvd.init()
        torch.cuda.set_device(0)
        hvd.allreduce(torch.ones(4, device="cuda"), name="x")
        """, env=_clean_env(TRAINRUN_GPU_OPERATIONS="nccl", CUDA_VISIBLE_DEVICES="0"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "ranks 0, 1 use one GPU" in out and "TRAINRUN_GPU_OPERATIONS=mpi" in out, out[-3000:]


def test_gpus_per_proc_isolates_and_refuses_oversharing(tmp_path):
    n = torch.cuda.device_count()
    probe = """
        import os, torch
        print("SEEN", os.environ["TRAINRUN_RANK"], os.environ.get("CUDA_VISIBLE_DEVICES"),
              os.environ.get("TRAINRUN_GPUS"), torch.cuda.device_count(), os.environ.get("TRAINRUN_GPU_OPERATIONS"))
        """
    proc = _launch(["-np", "1", "--gpus-per-proc", "1", "--mpi", "none"], tmp_path, probe)
    assert proc.returncode == 0, proc.stderr
    assert "SEEN 0 0 0 1 None" in proc.stdout, proc.stdout
    over = _launch(["-np", str(n + 1), "--gpus-per-proc", "1", "--mpi", "none"], tmp_path, probe)
    assert over.returncode == 2 and "--allow-gpu-sharing" in over.stderr and "Traceback" not in over.stderr, over.stderr
    shared = _launch(["-np", str(n + 1), "--gpus-per-proc", "1", "--allow-gpu-sharing", "--mpi", "none"], tmp_path, probe)
    assert shared.returncode == 0, shared.stderr
    assert f"SEEN {n} 0 0 1 mpi" in shared.stdout, shared.stdout  # the last rank wraps round to GPU 0


def test_check_shows_the_gpu(tmp_path):
    smi = subprocess.run([shutil.which("nvidia-smi"), "--query-gpu=name,memory.total,driver_version",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True).stdout
    name, memory, driver = [p.strip() for p in smi.splitlines()[0].split(",")]
    proc = subprocess.run([sys.executable, "-m", "trainrun", "--check", "-np", "1"], env=_clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"x {name} ({memory} MiB, driver {driver})" in proc.stdout, proc.stdout


@pytest.mark.parametrize("args", [["-np", "1"], ["-np", "2", "--allow-gpu-sharing"]], ids=["one_rank", "two_share"])
def test_example_trains_on_the_gpu(tmp_path, args):
    """The README's example on the GPU: one rank through NCCL, and two ranks sharing the GPU through host
    memory; the loss falls and rank 0 saves the checkpoint."""
    from pathlib import Path
    example = Path(__file__).parents[2] / "examples" / "train_torch.py"
    ckpt = tmp_path / "ckpt.pt"
    proc = subprocess.run([sys.executable, "-m", "trainrun", *args, sys.executable, str(example), "--epochs", "4",
                           "--checkpoint", str(ckpt)], env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "training on cuda" in proc.stdout, proc.stdout
    losses = [float(line.split("loss ")[1].split()[0]) for line in proc.stdout.splitlines() if "epoch " in line]
    assert len(losses) == 4 and losses[-1] < losses[0] and ckpt.exists(), proc.stdout
