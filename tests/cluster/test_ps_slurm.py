"""A TensorFlow parameter-server cluster inside a real Slurm allocation on the simulated hosts (the `slurm`
fixture): `salloc -N3 trainrun -np 5 --tf-cluster ps=2 python ps_strategy.py` trains through srun steps (no
SSH) with the ps on two hosts, and exits 0 when the chief finishes, nothing left on any host."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow not installed: pip install 'trainrun[tensorflow]'", allow_module_level=True)

pytestmark = pytest.mark.timeout(480)
EXAMPLE = Path(__file__).parents[2] / "examples" / "tensorflow" / "ps_strategy.py"


def test_ps_cluster_in_a_slurm_allocation(slurm, cluster, tmp_path):
    out = tmp_path / "chief.json"
    try:
        p = slurm.run(1, ["salloc", "-N3", "--ntasks-per-node=2", sys.executable, "-m", "trainrun", "-np", "5",
                          "--tf-cluster", "ps=2", sys.executable, str(EXAMPLE), "--steps", "40", "--out", str(out)],
                      cwd=tmp_path, timeout=400)
    finally:
        slurm.cancel_all()
    assert p.returncode == 0, p.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert sum(doc["losses"][-10:]) < sum(doc["losses"][:10])
    assert {d.split("/")[3] for d in doc["devices"].values()} == {"task:0", "task:1"}
    ps_hosts = sorted(line.split("]<stdout>:")[0] for line in p.stdout.splitlines() if ":ps " in line and "serving" in line)
    assert ps_hosts == ["[3", "[4"], p.stdout  # ranks 3 (h2) and 4 (h3)
    for i in (1, 2, 3):
        left = cluster.run(i, ["pgrep", "-af", str(out)], capture_output=True, text=True).stdout
        assert not [ln for ln in left.splitlines() if "pgrep" not in ln], left
