"""horovod.ray's RayExecutor on the real 3-node Ray cluster (conftest.py: h1 head, h2, h3, 2 CPUs each), with the
unchanged drivers of tests/ray/programs run on h1 against `--address auto`: a static executor spread one worker
per node (num_hosts=3) keeps its workers and world between calls, and an elastic torch loop that loses a worker
goes on, from its last commit, on the nodes left. Nothing of either is left on any node."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.cluster.ray.conftest import wait_nothing_left
from trainrun.plan.horovod_shim import SHIM_DIR

PROGRAMS = Path(__file__).parents[2] / "ray" / "programs"


def _steps(stdout: str) -> dict:
    steps: dict = {}
    for line in stdout.splitlines():
        if line.startswith("STEP "):
            key, value = json.loads(line[5:])
            steps[key] = value
        elif line.startswith("RESULTS "):
            steps["results"] = json.loads(line[8:])
    return steps


def test_static_executor_one_worker_per_node(ray_cluster):
    p = ray_cluster.run(1, [sys.executable, str(PROGRAMS / "executor_calls.py"), "--address", "auto", "--num-hosts", "3"],
                        env={"PYTHONPATH": SHIM_DIR}, cwd=PROGRAMS, timeout=300, capture_output=True, text=True)
    s = _steps(p.stdout)
    assert p.returncode == 0 and s.get("done"), (p.stdout[-2000:], p.stderr[-4000:])
    run = s["run"]
    assert [r[:4] for r in run] == [[0, 3, 0, 303.0], [1, 3, 0, 303.0], [2, 3, 0, 303.0]], run
    assert sorted(r[4] for r in run) == ["h1", "h2", "h3"], run  # STRICT_SPREAD: a node each
    assert s["execute2"] == [20, 20, 20] and s["single"] == 30
    assert [r[5] for r in s["remote"]] == [r[5] for r in run]  # the same worker processes throughout
    assert s["error"][:3] == ["RankError", 1, "ValueError"], s["error"]
    assert s["actors_left"] == []
    wait_nothing_left(ray_cluster)


def test_elastic_executor_goes_on_on_the_nodes_left(ray_cluster):
    p = ray_cluster.run(1, [sys.executable, str(PROGRAMS / "pytorch_ray_elastic.py"), "--address", "auto", "--fail-once",
                            "--min-workers", "2", "--max-workers", "6"],
                        env={"PYTHONPATH": SHIM_DIR}, cwd=PROGRAMS, timeout=300, capture_output=True, text=True)
    s = _steps(p.stdout)
    assert p.returncode == 0 and "results" in s, (p.stdout[-2000:], p.stderr[-4000:])
    results = s["results"]
    # 6 ranks (2 per node) first; rank 1 died, its node sits out: the last attempt is 4 ranks on 2 nodes
    assert [(r["rank"], r["size"], r["attempt"]) for r in results] == [(i, 4, 1) for i in range(4)], results
    assert all(r["epoch"] == 2 for r in results) and len({round(r["checksum"], 9) for r in results}) == 1, results
    assert [(r["epoch"], r["size"]) for r in s["logged"]][-2:] == [(1, 4), (2, 4)], s["logged"]  # ray_logger
    wait_nothing_left(ray_cluster)
