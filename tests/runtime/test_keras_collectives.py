"""trainrun.keras's collectives (allreduce, allgather, broadcast, broadcast_variables, reducescatter) on
Keras 3's torch and tensorflow backends, 2 ranks through the launcher (one launch per backend)."""
import importlib.util

import pytest

from tests.runtime.launch import check, run_cases

CASES = ["reducescatter_default_averages", "reducescatter_ops", "allreduce_ops", "allgather_uneven",
         "broadcast_and_variables", "tf_keras_module_ops"]
BACKENDS = {"torch": "torch", "tensorflow": "tensorflow"}  # KERAS_BACKEND -> the module it needs


@pytest.fixture(scope="module", params=sorted(BACKENDS))
def results(request, tmp_path_factory):
    backend = request.param
    if importlib.util.find_spec(BACKENDS[backend]) is None:
        pytest.skip(f"Keras's {backend} backend needs {BACKENDS[backend]}, which is not installed")
    return run_cases("keras_collectives", 2, tmp_path_factory.mktemp(f"keras_{backend}"),
                     env={"TRAINRUN_STALL_TIMEOUT": "20", "KERAS_BACKEND": backend, "CUDA_VISIBLE_DEVICES": ""},
                     timeout=300)


@pytest.mark.parametrize("case", CASES)
def test_case(results, case):
    check(results, case)
