"""Straggler detection on this machine, for real: 4 ranks (oversubscribed on 2 cores) train a small
torch model under DistributedOptimizer; one rank sleeps more per step. The launcher must name it
within 30 s of training start (the issue's acceptance), say where its time goes (the loader, before
the step, or compute, inside it), print the end-of-job summary; a healthy run prints neither."""
import json
import re
import sys
import threading
import time

import pytest
from launch_helpers import base_env, worker

pytestmark = pytest.mark.timeout(240)

JOB = worker("straggler_job.py")
DETECT_S = 30.0


def launch(start_trainrun, *args, job=JOB, **env):
    """Run the job to its end; (rc, [(seconds after the last rank's 'started', stderr line)], stdout)."""
    proc = start_trainrun("-np", 4, *args, sys.executable, job, env=base_env(SECONDS_TO_RUN="40", **env))
    started, err, out = [], [], []

    def read_err():
        for line in iter(proc.stderr.readline, b""):
            err.append((time.monotonic(), line.decode(errors="replace").rstrip("\n")))
    t = threading.Thread(target=read_err, daemon=True)
    t.start()
    for line in iter(proc.stdout.readline, b""):
        text = line.decode(errors="replace").rstrip("\n")
        out.append(text)
        if text.endswith("started"):
            started.append(time.monotonic())
    rc = proc.wait(timeout=200)
    t.join(10)
    assert len(started) == 4, out
    t0 = max(started)
    return rc, [(at - t0, line) for at, line in err], out


@pytest.mark.parametrize("where", ["compute", "loader"])
def test_the_slowed_rank_is_named_within_30_s(start_trainrun, tmp_path, where):
    rc, err, out = launch(start_trainrun, "--output-dir", tmp_path / "out", SLOW_RANKS="2", SLOW_S="0.1", SLOW_WHERE=where)
    assert rc == 0, err
    named = [(s, line) for s, line in err if "trainrun: straggler: rank" in line]
    assert named, "\n".join(line for _, line in err)
    after, line = named[0]
    assert re.match(r"trainrun: straggler: rank 2 on \S+: it was last to \d+% of collectives", line), line
    assert after < DETECT_S, f"named {after:.1f} s after training began: {line}"
    expected = "before the step" if where == "loader" else "inside the step"
    assert expected in line, line
    text = "\n".join(line for _, line in err)
    assert "straggler summary" in text and "rank 2 on" in text.split("straggler summary")[1].splitlines()[0]
    assert sum(1 for line in out if "done" in line) >= 4
    # --output-dir: every rank's windows, the later ones with the straggler named
    records = [json.loads(line) for line in (tmp_path / "out" / "straggler.jsonl").read_text().splitlines()]
    assert {r["rank"] for r in records} == {0, 1, 2, 3}
    assert records[-1]["straggler"] == [2] and all(r["wall_ms"] > 0 for r in records)


def test_without_an_optimizer_plain_allreduces_name_the_rank(start_trainrun):
    """Blocking allreduces (the lone-op path: the round bits cannot tell who came last, a solo round
    completing at once does), steps unknown: the rank is named, nothing said of where its time goes."""
    rc, err, _ = launch(start_trainrun, job=worker("straggler_allreduce.py"), SLOW_RANK="1")
    text = "\n".join(line for _, line in err)
    assert rc == 0, text
    named = [(s, line) for s, line in err if "trainrun: straggler: rank" in line]
    assert named and named[0][1].startswith("trainrun: straggler: rank 1 on "), text
    assert named[0][0] < DETECT_S and "its time goes" not in named[0][1], named[0]


def test_a_healthy_run_names_no_straggler(start_trainrun):
    rc, err, _ = launch(start_trainrun)
    text = "\n".join(line for _, line in err)
    assert rc == 0, text
    assert "straggler" not in text, text
