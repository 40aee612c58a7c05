"""commit() through the host's /dev/shm segment (wire/shm_slot.py) with real ranks: a rank SIGKILLed in the
middle of a commit leaves the previous commit intact and the restarted job resumes from it; the segments go
away at the end of the job whatever the end (success, failure, the launcher SIGKILLed), on this machine and
on "remote" hosts (pipe engine: one agent process per host, as over SSH)."""
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import psutil
from tests.elastic.harness import LiveRun, leftover_segments, wait_gone

WORKER = str(Path(__file__).parent / "workers" / "commit_state.py")
PIPE = [sys.executable, str(Path(__file__).parent / "pipe_trainrun.py")]


def rank0_pid(token: str) -> int:
    for p in psutil.process_iter(["cmdline"]):
        if token in " ".join(p.info["cmdline"] or ()):
            try:
                if p.environ().get("TRAINRUN_RANK") == "0":
                    return p.pid
            except psutil.Error:
                pass
    raise AssertionError("rank 0 not found")


def steps(lines: list[str]) -> list[tuple[int, int, float]]:
    out = []
    for line in lines:
        text = line.partition("<stdout>:")[2]
        if text.startswith("step "):
            _, s, _, r, _, w = text.split()
            out.append((int(s), int(r), float(w)))
    return out


def segments_gone(stderr: str, seconds: float = 15.0) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := leftover_segments(stderr)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_rank_killed_mid_commit_leaves_the_previous_commit_which_the_restart_uses(tmp_path):
    token = f"tok{uuid.uuid4().hex[:8]}"
    # commit (0, 3) stops between its payload and its header: slot 0 (commit 1's) is half overwritten
    run = LiveRun(["-v", "-np", "2", "--max-restarts", "1", "-x", "STEPS=6", WORKER, token], cwd=tmp_path,
                  env={"TRAINRUN_TEST_COMMIT_HOOK": "stall:0:3"})
    deadline = time.monotonic() + 120
    while "commit payload written, header not yet" not in run.stderr and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "header not yet" in run.stderr, run.stderr
    os.kill(rank0_pid(token), signal.SIGKILL)
    assert run.finish() == 0, run.stderr
    seen = steps(run.lines)
    assert seen[:3] == [(1, 0, 1.0), (2, 0, 2.0), (3, 0, 3.0)]
    assert seen[3:] == [(s, 1, float(s)) for s in range(3, 7)], seen  # resumed from commit 2 (step 2), not 3
    assert "final step 6 w 6" in "\n".join(run.lines)
    assert wait_gone(token) == [] and segments_gone(run.stderr) == []


def test_segments_are_removed_after_a_failure(tmp_path):
    token = f"tok{uuid.uuid4().hex[:8]}"
    run = LiveRun(["-v", "-np", "2", "--max-restarts", "1", "-x", "FAIL_STEP=3", WORKER, token], cwd=tmp_path)
    assert run.finish() == 3, run.stderr
    assert "restarts exhausted" in run.stderr and "state segment" in run.stderr  # one was made (-v logs it)
    assert wait_gone(token) == [] and segments_gone(run.stderr, 0) == []


def _sigkill_launcher(tmp_path, args: list[str], launcher=None) -> None:
    token = f"tok{uuid.uuid4().hex[:8]}"
    run = LiveRun(["-v", *args, "-x", "STEPS=10000", "-x", "STEP_PAUSE=0.2", WORKER, token], cwd=tmp_path, launcher=launcher)
    run.wait_for("step 3 ")
    assert leftover_segments(run.stderr), "no state segment while the job runs"
    launcher_pid = run.proc.pid
    os.kill(launcher_pid, signal.SIGKILL)
    run.finish()
    assert wait_gone(token, 30) == []
    assert segments_gone(run.stderr, 30) == []


def test_segment_on_the_launchers_host_is_removed_when_the_launcher_is_sigkilled(tmp_path):
    _sigkill_launcher(tmp_path, ["-np", "2", "--max-restarts", "1"])


def test_segments_on_agent_hosts_are_removed_when_the_launcher_is_sigkilled(tmp_path):
    _sigkill_launcher(tmp_path, ["-H", "far1:1,far2:1", "--max-restarts", "1"], launcher=PIPE)
