"""The elastic launcher end to end on this machine: "remote" hosts through the pipe engine (pipe_trainrun.py:
one agent subprocess per host name, no SSH), ranks training a torch model with hvd.elastic.TorchState.
The ranks train with the framework-free runtime (workers/elastic_numpy.py: ObjectState; starts fast);
the same scenarios with torch's TorchState on simulated hosts (SSH, network cuts) are in
tests/cluster/test_elastic.py."""
import os
import signal
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from tests.elastic.harness import NUMPY_WORKER, LiveRun, by_rank, discovery, leftover_segments, steps_seen, wait_gone

PIPE = [sys.executable, str(Path(__file__).parent / "pipe_trainrun.py")]


def rank_pids(token: str, host: str) -> list[int]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if token in " ".join(p.info["cmdline"] or ()):
            try:
                if p.environ().get("TRAINRUN_HOSTNAME") == host:
                    out.append(p.pid)
            except psutil.Error:
                pass
    return out


def test_host_dies_job_shrinks_then_grows_back(tmp_path):
    token = f"tok{uuid.uuid4().hex[:8]}"
    script, listing = discovery(tmp_path, ["far1:1", "far2:1", "far3:1"])
    steps, every = 40, 5
    run = LiveRun(["-v", "--host-discovery-script", str(script), "--min-np", "2", "--blacklist-cooldown-range", "1", "2",
                   "-x", f"STEPS={steps}", "-x", f"COMMIT_EVERY={every}", "-x", "STEP_PAUSE=0.1",
                   NUMPY_WORKER, token], cwd=tmp_path, launcher=PIPE)
    run.wait_for("step 8 size 3")
    listing.write_text("far1:1\nfar2:1\n")
    pids = rank_pids(token, "far3")
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGKILL)
    run.wait_for("size 2")
    listing.write_text("far1:1\nfar2:1\nfar3:1\n")
    run.wait_for("size 3 restart 2")
    assert run.finish() == 0, run.stderr
    seen = steps_seen(run.lines)
    first2 = next(i for i, (_, n, _) in enumerate(seen) if n == 2)
    assert seen[first2][0] % every == 1 and 1 < seen[first2][0] <= seen[first2 - 1][0] + 1, seen
    finals = {r: [t for t in texts if t.startswith("final")] for r, texts in by_rank(run.lines).items()}
    assert sorted(finals) == [0, 1, 2] and len({f[0] for f in finals.values()}) == 1, finals
    assert finals[0][0].startswith(f"final step {steps} ")
    assert "[0]<stdout>:reset size 2 lr 0.02" in run.lines and "[0]<stdout>:reset size 3 lr 0.03" in run.lines
    assert "restart 1 in 0s; far3 sits out 1s" in run.stderr  # no back-off: the failed host sits the next attempt out
    assert "hosts changed (far1, far2 -> far1, far2, far3)" in run.stderr
    assert "[0]<stdout>:host updates 1 check True" in run.lines  # elastic sizing: commit() checks for host changes
    assert wait_gone(token) == [] and leftover_segments(run.stderr) == []


def test_max_restarts_resumes_a_program_that_failed_once(tmp_path):
    token = f"tok{uuid.uuid4().hex[:8]}"
    run = LiveRun(["-v", "-np", "2", "--max-restarts", "2", "-x", "STEPS=12", "-x", "FAIL_AT=1:5", NUMPY_WORKER, token],
                  cwd=tmp_path, env={"STEPS": "12", "FAIL_AT": "1:5", "COMMIT_EVERY": "5"})
    assert run.finish() == 0, run.stderr
    seen = steps_seen(run.lines)
    assert seen[:5] == [(s, 2, 0) for s in range(1, 6)]
    assert seen[5:] == [(s, 2, 1) for s in range(6, 13)]  # TRAINRUN_RESTART_COUNT 1, resumed from the commit at 5
    assert "failing at step 5" in run.stderr and "restart 1 of 2 in 0.5s" in run.stderr  # same hosts: a back-off
    assert "1 failure(s) in 2 attempt(s)" in run.stderr
    # no elastic sizing: the launcher never announces a host change, so commit() runs no check (no broadcast)
    assert "[0]<stdout>:host updates 0 check False" in run.lines
    assert wait_gone(token) == [] and leftover_segments(run.stderr) == []


def test_deterministic_start_failure_is_not_restarted(tmp_path):
    token = f"tok{uuid.uuid4().hex[:8]}"
    prog = tmp_path / "bad.py"
    prog.write_text("import sys\nimport no_such_module_anywhere\n")
    run = LiveRun(["-v", "-H", "far1:2,far2:2", "--max-restarts", "5", str(prog), token], cwd=tmp_path, launcher=PIPE)
    assert run.finish() == 1
    assert "every rank (4) exited with code 1 within" in run.stderr
    assert "No module named 'no_such_module_anywhere'" in run.stderr and "a restart would fail the same way" in run.stderr
    assert "1 failure(s) in 1 attempt(s)" in run.stderr and "attempt 1:" not in run.stderr
    assert wait_gone(token) == []


def test_restarts_exhausted_exit_with_the_root_cause(tmp_path):
    token = f"tok{uuid.uuid4().hex[:8]}"
    prog = tmp_path / "flaky.py"
    prog.write_text("import os, sys, time\nimport trainrun.runtime as hvd\nimport numpy as np\nhvd.init()\n"
                    "for i in range(40):\n    hvd.allreduce(np.ones(4), name='x')\n"
                    "    if hvd.rank() == 1 and i == 3:\n        os._exit(9)\n    time.sleep(0.02)\n")
    run = LiveRun(["-v", "-H", "far1:1,far2:1", "--max-restarts", "2", str(prog), token], cwd=tmp_path, launcher=PIPE)
    assert run.finish() == 9, run.stderr
    err = run.stderr
    assert "restarts exhausted after 2 restart(s)" in err and "3 failure(s) in 3 attempt(s)" in err
    for attempt, action in ((0, "restart 1 of 2"), (1, "restart 2 of 2"), (2, "restarts exhausted (2 of 2)")):
        assert f"attempt {attempt}: rank 1 on far2 (local rank 0) exited with code 9 -> {action}" in err, err
    assert wait_gone(token) == [] and leftover_segments(run.stderr) == []


def test_the_backoff_stops_doubling_at_max_backoff(tmp_path):
    """The wait before each restart is printed, and never passes --max-backoff (issue 38)."""
    token = f"tok{uuid.uuid4().hex[:8]}"
    prog = tmp_path / "flaky.py"
    prog.write_text("import os, time\nimport trainrun.runtime as hvd\nimport numpy as np\nhvd.init()\n"
                    "hvd.allreduce(np.ones(4), name='x')\ntime.sleep(0.1)\nif hvd.rank() == 1:\n    os._exit(9)\n")
    run = LiveRun(["-np", "2", "--max-restarts", "3", "--max-backoff", "0.7", "--no-warm-ranks", str(prog), token],
                  cwd=tmp_path)
    assert run.finish() == 9, run.stderr
    err = run.stderr
    for n, wait in ((1, "0.5s"), (2, "0.7s (--max-backoff)"), (3, "0.7s (--max-backoff)")):
        assert f"exited with code 9; restart {n} of 3 in {wait}" in err, err
    assert "restarts exhausted after 3 restart(s)" in err
    assert wait_gone(token) == []


def test_tensorflow_keras_state_resumes_from_the_last_commit(tmp_path):
    """hvd.elastic.TensorFlowKerasState (trainrun.tensorflow): a rank fails at step 5 of the first attempt; the
    restart resumes from the commit at step 5 (weights and optimizer momentum from the agents, no disk) and both
    ranks end with the same weights and optimizer variables."""
    pytest.importorskip("tensorflow", reason="tensorflow-cpu not installed (pip install 'trainrun[tensorflow]')")
    token = f"tok{uuid.uuid4().hex[:8]}"
    worker = str(Path(__file__).parent / "workers" / "elastic_keras.py")
    run = LiveRun(["-v", "-np", "2", "--max-restarts", "1", worker, token], cwd=tmp_path,
                  env={"STEPS": "8", "FAIL_AT": "1:5", "COMMIT_EVERY": "5", "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert run.finish(timeout=300) == 0, run.stderr
    seen = steps_seen(run.lines)
    assert seen[:5] == [(s, 2, 0) for s in range(1, 6)]
    assert seen[5:] == [(s, 2, 1) for s in range(6, 9)]  # restart 1 goes on from the commit at step 5
    finals = {line.split("sha ")[1] for line in run.lines if "final step 8 sha" in line}
    assert len(finals) == 1 and sum("final step 8" in line for line in run.lines) == 2
    assert wait_gone(token) == [] and leftover_segments(run.stderr) == []
