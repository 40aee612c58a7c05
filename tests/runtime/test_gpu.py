"""CUDA tensors on 2 ranks: NCCL backend, and host staging (TRAINRUN_GPU_OPERATIONS=mpi)."""
import pytest

from tests.runtime.launch import check, run_cases

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")]

CASES = ["allreduce_on_gpu", "gather_broadcast_alltoall_reducescatter_on_gpu", "distributed_optimizer_on_gpu"]


@pytest.fixture(scope="module", params=["nccl", "mpi"])
def results(request, tmp_path_factory):
    if request.param == "nccl":
        from trainrun.runtime.backends import nccl
        if not nccl.available():
            pytest.skip("libnccl.so.2 not found")
    return run_cases("gpu_ops", 2, tmp_path_factory.mktemp(f"gpu_{request.param}"),
                     env={"TRAINRUN_GPU_OPERATIONS": request.param, "TRAINRUN_STALL_TIMEOUT": "30"})


@pytest.mark.parametrize("case", CASES)
def test_case(results, case):
    check(results, case)
