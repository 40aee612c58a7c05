"""Horovod's tuning variables take effect in a real 2-rank launch (issue 28 item 3): HOROVOD_FUSION_THRESHOLD
and HOROVOD_CACHE_CAPACITY change what the engines run with, HOROVOD_STALL_CHECK_TIME_SECONDS when a stall is
reported, HOROVOD_TIMELINE writes the trace, HOROVOD_LOG_LEVEL what rank 0 prints; a variable trainrun does not
honour is named once. (The mapping itself: tests/unit/test_horovod_env.py.)"""
import json
from pathlib import Path

from tests.runtime.launch import run_ranks

PROGRAM = Path(__file__).parent / "programs" / "tuning.py"
NO_EFFECT = "trainrun: HOROVOD_HIERARCHICAL_ALLREDUCE has no effect: "


def tuning(proc) -> dict:
    rows = [json.loads(line.split("TUNING ", 1)[1]) for line in proc.stdout.splitlines() if "TUNING " in line]
    assert sorted(r["rank"] for r in rows) == [0, 1], proc.stdout + proc.stderr
    return {r["rank"]: r for r in rows}


def test_horovod_variables_take_effect(tmp_path):
    timeline = tmp_path / "timeline.json"
    env = {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CACHE_CAPACITY": "2", "HOROVOD_STALL_CHECK_TIME_SECONDS": "2",
           "HOROVOD_TIMELINE": str(timeline), "HOROVOD_LOG_LEVEL": "info", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}
    proc = run_ranks(PROGRAM, 2, ["stall"], env=env, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for row in tuning(proc).values():
        # threshold 0: no two tensors share a reduction; capacity 2: only the first two signatures get cache ids
        assert (row["threshold"], row["capacity"], row["reductions"], row["cached"]) == (0, 2, 8, 2), row
    assert "Stalled for more than 2 s" in out, out  # the default would be 60 s
    assert out.count(NO_EFFECT) == 1, out  # rank 0 only, and once although init() ran twice
    assert out.count("trainrun: settings: fusion threshold 0 B, cache capacity 2, stall timeout 2 s") == 1, out
    events = json.loads(timeline.read_text())["traceEvents"]
    assert any(e.get("name") == "ALLREDUCE" for e in events)


def test_defaults_and_a_quiet_log_level():
    env = {"HOROVOD_LOG_LEVEL": "error", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}
    proc = run_ranks(PROGRAM, 2, env=env, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for row in tuning(proc).values():
        assert (row["threshold"], row["capacity"], row["cached"]) == (64 * 1024 * 1024, 4096, 8), row
    assert "has no effect" not in out and "trainrun: settings:" not in out, out
