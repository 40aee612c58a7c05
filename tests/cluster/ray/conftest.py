"""The `ray_cluster` fixture: a real Ray cluster on the session's simulated hosts (scripts/ray_testbed.py: the
head on h1, a node on h2 and h3, 2 CPUs each), up once for this folder's tests and torn down after them (package
scope: the other cluster tests count the hosts' processes and /dev/shm, and Ray's daemons and object store must
not be there), checking that no Ray process is left on any host. Skips with the reason when Ray or the testbed is missing.

Every test here also gets `nothing_left` run after it: no trainrun agent or rank, no actor and no placement
group of trainrun's on any node (the tests' own proof that a job leaves nothing, whatever ended it).
"""
from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("trainrun_ray_testbed", Path(__file__).parents[3] / "scripts/ray_testbed.py")
ray_testbed = sys.modules["trainrun_ray_testbed"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ray_testbed)

LIST_LEFT = """
import ray
from ray._private.state import actors
ray.init(logging_level="ERROR")
acts = [a for a in actors().values() if str(a.get("State")) not in ("DEAD", "4") and "NodeProcesses" in str(a)]
pgs = [g for g in ray.util.placement_group_table().values() if g.get("state") != "REMOVED"]
print(len(acts), len(pgs))
"""  # Ray's GCS tables (the test cluster runs no dashboard, which ray.util.state's API needs)


@pytest.fixture(scope="package")
def ray_cluster(cluster):
    reason = ray_testbed.missing_requirement()
    if reason:
        pytest.skip(f"ray tests: {reason}")
    rc = ray_testbed.up(cluster)
    try:
        yield rc
    finally:
        left = ray_testbed.down(cluster)
        assert not left, f"ray teardown left {left}"


def trainrun_processes(rc) -> dict[int, list[str]]:
    """Host index -> command lines of trainrun's processes there: launchers and agents (`-m trainrun...`), and
    ranks and spares (TRAINRUN_JOB_ID in their environment)."""
    import os

    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    out: dict[int, list[str]] = {}
    for h in rc.tb.hosts:
        for pid in rc.tb.on_host(h.index, pids):
            cmd = ray_testbed._cmdline(pid)
            try:
                ranked = b"TRAINRUN_JOB_ID=" in Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                ranked = False
            if ranked or " -m trainrun" in cmd or "trainrun.agent" in cmd:
                out.setdefault(h.index, []).append(f"{pid} {cmd[:120]}")
    return out


def ray_left(rc) -> tuple[int, int]:
    """(live NodeProcesses actors, placement groups not removed) as Ray's state API lists them."""
    p = rc.run(1, [sys.executable, "-c", LIST_LEFT], timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    a, g = p.stdout.split()[-2:]
    return int(a), int(g)


def wait_nothing_left(rc, timeout: float = 30.0) -> None:
    """Assert that within `timeout` s no trainrun process runs on any host and Ray holds none of its actors
    or placement groups."""
    deadline = time.monotonic() + timeout
    while True:
        procs, left = trainrun_processes(rc), ray_left(rc)
        if not procs and left == (0, 0):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"left after the job: processes {procs}, (actors, placement groups) {left}")
        time.sleep(1.0)
