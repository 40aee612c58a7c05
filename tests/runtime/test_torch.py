"""trainrun.torch ops and DistributedOptimizer training on 2 ranks (one launch per worker)."""
import pytest

from tests.runtime.launch import check, run_cases

pytest.importorskip("torch")

OPS = ["allreduce_dtypes_ops", "in_place_and_non_contiguous", "async_grouped_and_scaled", "grouped_allreduce_layouts", "grouped_in_place_copied_by_mpi",
       "gather_broadcast_alltoall_reducescatter", "autograd", "objects"]
TRAIN = ["matches_single_process", "backward_passes_per_step_2", "fp16_compression", "groups", "gradient_batches", "buckets", "sparse_and_unused_in_bucket", "unused_parameter_in_group",
         "broadcast_makes_diverged_ranks_identical", "synchronize_then_skip", "optimizer_errors"]


@pytest.fixture(scope="module")
def ops_results(tmp_path_factory):
    return run_cases("torch_ops", 2, tmp_path_factory.mktemp("torch_ops"), env={"TRAINRUN_STALL_TIMEOUT": "20"})


@pytest.fixture(scope="module")
def train_results(tmp_path_factory):
    return run_cases("torch_train", 2, tmp_path_factory.mktemp("torch_train"), env={"TRAINRUN_STALL_TIMEOUT": "20"})


@pytest.mark.parametrize("case", OPS)
def test_ops(ops_results, case):
    check(ops_results, case)


@pytest.mark.parametrize("case", TRAIN)
def test_train(train_results, case):
    check(train_results, case)


def test_example_trains(tmp_path):
    from pathlib import Path

    from tests.runtime.launch import run_ranks
    example = Path(__file__).parents[2] / "examples" / "train_torch.py"
    ckpt = tmp_path / "ck.pt"
    proc = run_ranks(example, 2, ["--epochs", "2", "--samples", "512", "--checkpoint", str(ckpt)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if "epoch " in line]  # the launcher may prefix "[0]"
    assert len(lines) == 2 and ckpt.exists(), proc.stdout  # printed and saved by rank 0 only


@pytest.mark.parametrize("elastic", ["", "1"])
def test_one_rank_optimizer_reduces_only_in_an_elastic_job(tmp_path, elastic):
    """As Horovod: at world size 1 DistributedOptimizer reduces nothing, unless the job is elastic (it may
    grow back; scripts/bench_gpu.py measures the GPU path this way)."""
    from tests.runtime.launch import run_ranks
    script = tmp_path / "one.py"
    script.write_text(
        "import torch, trainrun.torch as hvd\n"
        "from trainrun.runtime import lifecycle\n"
        "hvd.init()\n"
        "m = torch.nn.Linear(2, 1)\n"
        "opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters())\n"
        "before = lifecycle.engine().reductions\n"
        "m(torch.ones(1, 2)).sum().backward()\n"
        "opt.step()\n"
        "print('REDUCTIONS', lifecycle.engine().reductions - before)\n")
    proc = run_ranks(script, 1, env={"TRAINRUN_ELASTIC": elastic}, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("REDUCTIONS 0" in proc.stdout) == (not elastic), proc.stdout


def test_gpu_worker_cases_on_cpu_tensors(tmp_path):
    """The GPU test's worker (workers/gpu_ops.py) run on CPU tensors on 3 ranks (uneven reducescatter,
    empty alltoall parts), so its reference logic and the CPU paths it mirrors are checked on every machine,
    not only where tests/runtime/test_gpu.py runs."""
    results = run_cases("gpu_ops", 3, tmp_path, env={"GPU_OPS_DEVICE": "cpu", "TRAINRUN_STALL_TIMEOUT": "20"},
                        timeout=180)
    assert len(results) == 9, sorted(results)
    for case in results:
        check(results, case)


@pytest.mark.parametrize("thread_level", ["multiple", "serialized"])
def test_grouped_in_place_copy_falls_back_below_thread_multiple(tmp_path, thread_level):
    """The MPI copy of a torch group (runtime/gather.py) runs only at MPI_THREAD_MULTIPLE (the caller's
    thread copies while the engine's communicates); below it the group is copied by torch, still right."""
    from tests.runtime.launch import run_ranks
    script = tmp_path / "levels.py"
    script.write_text(
        "import sys, mpi4py\n"
        "mpi4py.rc.thread_level = sys.argv[1]\n"
        "import torch, trainrun.torch as hvd\n"
        "from trainrun.runtime import gather\n"
        "hvd.init()\n"
        "ts = [torch.full((i + 1,), float(hvd.rank() + i)) for i in range(20)]\n"
        "hvd.grouped_allreduce_(ts, op=hvd.Sum)\n"
        "assert all(torch.equal(t, torch.full_like(t, float(sum(r + i for r in range(hvd.size())))))\n"
        "           for i, t in enumerate(ts)), ts\n"
        "print('MPI COPIES', len(gather._layouts))\n")
    proc = run_ranks(script, 2, [thread_level], timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    copies = 1 if thread_level == "multiple" else 0
    assert proc.stdout.count(f"MPI COPIES {copies}") == 2, proc.stdout


def test_grouped_copy_refuses_after_mpi_finalize(tmp_path):
    """A layout cached while MPI ran is not used once MPI_Finalize has run: gather/scatter say False
    (the caller copies with torch) instead of calling into a finalized MPI."""
    from tests.runtime.launch import run_ranks
    script = tmp_path / "finalized.py"
    script.write_text(
        "import numpy as np, torch, trainrun.torch as hvd\n"
        "from mpi4py import MPI\n"
        "from trainrun.runtime import gather\n"
        "hvd.init()\n"
        "hvd.grouped_allreduce_([torch.ones(4) for _ in range(3)])\n"
        "blocks = next(iter(gather._layouts))\n"
        "hvd.shutdown()\n"
        "MPI.Finalize()\n"
        "buf = np.zeros(sum(blocks[1]), np.uint8)\n"
        "print('AFTER FINALIZE', gather.gather(blocks, buf), gather.scatter(buf, blocks))\n")
    proc = run_ranks(script, 2, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("AFTER FINALIZE False False") == 2, proc.stdout
