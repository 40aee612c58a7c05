"""Issue 40: a graph's gradients are reduced in fused buckets of the runtime's bucket size taken from the
last layer back, so on a model larger than a bucket the first reductions start while backward still runs
(tensorflow/reduce.py); the values are those of one average over ranks (workers/tf_buckets.py, 2 ranks,
real launcher and MPI)."""
import importlib.util
import json
from pathlib import Path

import pytest

from tests.runtime.launch import run_ranks

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow not installed: pip install 'trainrun[tensorflow]'", allow_module_level=True)

WORKER = Path(__file__).parent / "workers" / "tf_buckets.py"


def test_graph_gradients_travel_in_buckets_with_the_same_values(tmp_path):
    proc = run_ranks(WORKER, 2, [str(tmp_path)], env={"TF_CPP_MIN_LOG_LEVEL": "2", "TRAINRUN_BUCKET_BYTES": str(1 << 20)}, timeout=240)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)
               if (tmp_path / f"rank{r}.json").exists()]
    assert len(results) == 2, f"rc={proc.returncode}\n{proc.stderr[-3000:]}"
    for res in results:
        assert "error" not in res, res
        assert res["nodes"] == 3, res  # 2.6 MB in buckets of at most 1 MiB
        assert 0 < res["first_bucket_bytes"] <= 1 << 20, res
    assert proc.returncode == 0, proc.stderr[-3000:]
