"""Horovod 0.28.1's TensorFlow behaviour on 2, 3 and 4 ranks: one launch per size runs every case of
workers/tf_horovod.py (TensorFlow's import costs seconds a rank)."""
import importlib.util

import pytest

from tests.runtime.launch import check, run_ranks

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow not installed: pip install 'trainrun[tensorflow]'", allow_module_level=True)

import json  # noqa: E402
from pathlib import Path  # noqa: E402

WORKER = Path(__file__).parent / "workers" / "tf_horovod.py"
# one launch per size runs every case (Keras fits included): 4 ranks on 2 loaded cores take minutes
pytestmark = pytest.mark.timeout(1500)
ENV = {"TRAINRUN_STALL_TIMEOUT": "60", "TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "tensorflow"}
CASES = ["mismatches_raise_failed_precondition", "bad_arguments_raise_invalid_argument",
         "alltoall_without_splits_returns_the_output_alone",
         "gradients_follow_horovods_tensorflow_convention", "horovods_public_names_exist",
         "broadcast_in_place_and_grouped_ops", "partial_distributed_gradient_tape_keeps_local_layers_local",
         "sync_batch_normalization_uses_every_ranks_batch", "learning_rate_schedule_callback_sets_the_rate_per_epoch",
         "indexed_slices_in_grouped_allreduce", "broadcast_callback_leaves_local_variables_alone",
         "aggregation_with_a_user_optimizer_subclass_sparse_as_dense_and_an_infinite_gradient",
         "partial_distributed_optimizer_keeps_local_layers_local"]
SIZES = [2, 3, 4]


@pytest.fixture(scope="module", params=SIZES, ids=[f"np{n}" for n in SIZES])
def results(request, tmp_path_factory):
    n, out = request.param, tmp_path_factory.mktemp(f"tfh{request.param}")
    proc = run_ranks(WORKER, n, [str(out)], env=ENV, timeout=1400)
    res = {}
    for r in range(n):
        path = out / f"rank{r}.json"
        assert path.exists(), f"rank {r} wrote no results (rc={proc.returncode})\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        for name, err in json.loads(path.read_text()).items():
            res.setdefault(name, []).append(err)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return res


@pytest.mark.parametrize("case", CASES)
def test_case(results, case):
    check(results, case)

