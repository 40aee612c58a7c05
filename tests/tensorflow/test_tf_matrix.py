"""The TensorFlow conformance matrix (workers/tf_matrix.py): every op x dtype x eager/tf.function/TF1 graph x
process set, and every differentiable op's gradient (Horovod's TensorFlow convention), against float64
references, on 2, 3 and 4 ranks through the launcher: one launch per size runs the whole matrix."""
import importlib.util

import pytest

from tests.runtime.launch import check, run_cases

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow not installed: pip install 'trainrun[tensorflow]'", allow_module_level=True)

pytestmark = pytest.mark.timeout(900)
ENV = {"TRAINRUN_STALL_TIMEOUT": "60", "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
CASES = [f"{kind}_{mode}" for mode in ("eager", "tf_function", "graph") for kind in ("matrix", "gradients")]
SIZES = [2, 3, 4]


@pytest.fixture(scope="module", params=SIZES, ids=[f"np{n}" for n in SIZES])
def results(request, tmp_path_factory):
    return run_cases("../../tensorflow/workers/tf_matrix", request.param,
                     tmp_path_factory.mktemp(f"tfm{request.param}"), env=ENV, timeout=850)


@pytest.mark.parametrize("case", CASES)
def test_case(results, case):
    check(results, case)
