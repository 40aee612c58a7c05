"""Graph collectives where trainrun's TensorFlow kernels are not built (TRAINRUN_TF_NATIVE=0, as on a host
without a compiler): the fallback of one blocking numpy_function node per collective gives the same
values in a tf.function and in a TF1 session (workers/tf_native_off.py), on 2 and 3 ranks."""
import importlib.util
import json
from pathlib import Path

import pytest

from tests.runtime.launch import run_ranks

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow not installed: pip install 'trainrun[tensorflow]'", allow_module_level=True)

WORKER = Path(__file__).parent / "workers" / "tf_native_off.py"
ENV = {"TRAINRUN_TF_NATIVE": "0", "TRAINRUN_STALL_TIMEOUT": "60", "TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.mark.parametrize("np_", [2, 3])
def test_graph_collectives_without_the_native_kernels(tmp_path, np_):
    proc = run_ranks(WORKER, np_, [str(tmp_path)], env=ENV, timeout=240)
    results = {}
    for r in range(np_):
        path = tmp_path / f"rank{r}.json"
        assert path.exists(), f"rank {r} wrote no result (rc={proc.returncode})\n{proc.stderr[-3000:]}"
        results[r] = json.loads(path.read_text())
    assert all(res == {"ok": True, "native": False} for res in results.values()), results
    assert proc.returncode == 0, proc.stderr[-3000:]
