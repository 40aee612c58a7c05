"""Issue 29: a graph step holding many more independent collectives than TF has inter-op threads
completes with the right values (graph_ops.py: submit / asynchronous wait / finish nodes). Before,
each collective blocked a TF thread inside its node and the TF1 case waited for good: the launch's
timeout turns that into a clean failure."""
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from tests.runtime.launch import run_ranks

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow not installed: pip install 'trainrun[tensorflow]'", allow_module_level=True)

WORKER = Path(__file__).parent / "workers" / "tf_many_collectives.py"
ENV = {"TRAINRUN_STALL_TIMEOUT": "60", "TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.mark.parametrize("np_", [2, 3])
@pytest.mark.parametrize("mode", ["tf1", "function"])
def test_many_independent_collectives_in_one_step(tmp_path, mode, np_):
    try:
        proc = run_ranks(WORKER, np_, [str(tmp_path), mode], env=ENV, timeout=240)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{mode} -np {np_}: no result in {e.timeout} s (the collectives wait on each other)\n"
                    f"{(e.stderr or '')[-3000:]}")
    results = {}
    for r in range(np_):
        path = tmp_path / f"rank{r}.json"
        assert path.exists(), f"rank {r} wrote no result (rc={proc.returncode})\n{proc.stderr[-3000:]}"
        results[r] = json.loads(path.read_text())
    assert all(res == {"ok": True} for res in results.values()), results
    assert proc.returncode == 0, proc.stderr[-3000:]
