"""Issues 29 and 40: a graph collective is one native node, and a lone one crosses into Python once
(graph_ops.py), checked in one process without MPI (workers/tf_graph_lone_op.py; TensorFlow is imported
in a subprocess, as tests/tensorflow shadows the package here)."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow not installed: pip install 'trainrun[tensorflow]'", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parent / "workers" / "tf_graph_lone_op.py"


def test_lone_graph_collective_one_python_crossing_and_typed_failure():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "launcher"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, str(WORKER)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    if last.startswith("skip:"):
        pytest.skip(last[5:].strip())
    assert last == "ok", proc.stdout[-2000:]
