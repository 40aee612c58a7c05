"""Warm ranks (--warm-ranks, on by default for elastic jobs; elasticjob/spares.py): after a failure, the next
attempt's ranks start as spare interpreters that imported torch while the job trained, on this machine
(the launcher's LocalRanks) and on agents (pipe hosts). They must be indistinguishable from cold ranks to
the program (environment, argv, cwd, __main__, sys.path, /proc/PID/environ, tracebacks, exit codes), and
nothing of them may be left after the job. Real launcher, agents, MPI and torch training
(workers/warm_probe.py)."""
import os
import re
import signal
import sys
import time
import uuid

import pytest
from pathlib import Path

from tests.elastic.harness import LiveRun, by_rank, leftover_segments, wait_gone
from tests.elastic.test_elastic_pipe import PIPE, rank_pids

PROBE = str(Path(__file__).parent / "workers" / "warm_probe.py")


def who(lines: list[str]) -> dict[int, dict[str, str]]:
    """Each rank's `who` line of the restarted attempt, as its fields."""
    out = {}
    for rank, texts in by_rank(lines).items():
        for text in texts:
            if text.startswith("who "):
                out[rank] = dict(re.findall(r"(\w+)=(\[[^\]]*\]|\S+)", text))
    return out


def test_a_restart_starts_warm_ranks_that_look_like_cold_ones(tmp_path):
    token = f"tok{uuid.uuid4().hex[:8]}"
    run = LiveRun(["-v", "-np", "2", "--max-restarts", "1", PROBE, token], cwd=tmp_path,
                  env={"WANT_SPARES": "2", "FAIL_RANK": "1"})
    assert run.finish() == 0, run.stderr
    assert "starting 2 warm rank(s)" in run.stderr and "2 of 2 rank(s) on localhost started warm" in run.stderr
    seen = who(run.lines)
    assert sorted(seen) == [0, 1], run.lines
    for rank, f in seen.items():
        assert f["warm"] == "True", f  # torch was imported before the script ran: a spare became this rank
        assert f["restart"] == "1" and f["resumed"] == "10"  # the new attempt, from the commit at step 10
        assert f["main"] == "__main__" and f["argv"] == f"['{token}']"
        assert f["cwd"] == str(tmp_path) and f["path0"] == str(Path(PROBE).parent)
        assert f["comm"] == os.path.basename(sys.executable)[:15]  # no longer named trainrun-warm
        assert f["proc_rank"] == str(rank)  # /proc/PID/environ shows the rank's variables, as a cold rank's
    assert [t for t in by_rank(run.lines)[0] if t.startswith("final")] == ["final step 30"]
    assert wait_gone(token) == [] and leftover_segments(run.stderr) == []  # spares of the last attempt too


def test_a_lost_hosts_survivors_restart_warm_on_their_agent(tmp_path):
    token = f"tok{uuid.uuid4().hex[:8]}"
    run = LiveRun(["-v", "-H", "far1:2,far2:2", "--min-np", "2", PROBE, token], cwd=tmp_path,
                  env={"WANT_SPARES": "4"}, launcher=PIPE)
    run.wait_for("spares ready", timeout=240)
    for pid in rank_pids(token, "far2"):
        os.kill(pid, signal.SIGKILL)
    assert run.finish() == 0, run.stderr
    seen = who(run.lines)
    assert sorted(seen) == [0, 1] and all(f["warm"] == "True" for f in seen.values()), seen
    # from a commit of attempt 0 (every 5 steps; it trained past step 10 until far2's ranks were killed)
    assert all(int(f["resumed"]) >= 10 and int(f["resumed"]) % 5 == 0 for f in seen.values()), seen
    assert wait_gone(token) == [] and leftover_segments(run.stderr) == []  # far2's idle spares too


def test_no_warm_ranks_restarts_cold(tmp_path):
    token = f"tok{uuid.uuid4().hex[:8]}"
    run = LiveRun(["-v", "-np", "2", "--max-restarts", "1", "--no-warm-ranks", PROBE, token], cwd=tmp_path,
                  env={"FAIL_RANK": "1"})
    assert run.finish() == 0, run.stderr
    assert "warm rank" not in run.stderr
    seen = who(run.lines)
    assert sorted(seen) == [0, 1] and all(f["warm"] == "False" for f in seen.values()), seen
    assert wait_gone(token) == [] and leftover_segments(run.stderr) == []


def test_a_dead_spare_means_a_cold_start_and_a_warm_ranks_exception_reads_as_a_cold_ones(tmp_path):
    token = f"tok{uuid.uuid4().hex[:8]}"
    run = LiveRun(["-v", "-np", "2", "--max-restarts", "1", PROBE, token], cwd=tmp_path,
                  env={"WANT_SPARES": "2", "FAIL_RANK": "1", "RAISE_IF_WARM": "1", "KILL_A_SPARE": "1"})
    code = run.finish()
    seen = who(run.lines)
    # one spare was SIGKILLed while it waited: one rank started as the other, one cold
    assert sorted(f["warm"] for f in seen.values()) == ["False", "True"], (seen, run.stderr)
    warm = next(r for r, f in seen.items() if f["warm"] == "True")
    assert code == 1, run.stderr  # the uncaught exception's exit code, as `python SCRIPT` gives it
    err = run.stderr
    assert f"ValueError: raised by warm rank {warm}" in err
    trace = [line for line in err.splitlines() if line.startswith(f"[{warm}]<stderr>:  File ")]
    assert trace and PROBE in trace[0], trace  # the traceback starts in the program, as a cold rank's does
    assert not any("spare.py" in line or "runpy" in line for line in trace), trace
    assert "restarts exhausted" in err
    assert wait_gone(token) == [] and leftover_segments(run.stderr) == []


class _Guard:
    def __init__(self):
        self.pids = []

    def add_group(self, pid):
        self.pids.append(pid)


def test_a_spare_handed_its_rank_before_its_imports_are_done_runs_it(tmp_path):
    """The hand-off is queued on the spare's socket while it still imports torch (a failure soon after the
    job started): it becomes the rank once done, rather than finding its owner's end closed and leaving."""
    from trainrun.wire.spare_handoff import Handoff
    from trainrun.elasticjob.spares import SparePool

    script = tmp_path / "job.py"
    script.write_text("import sys, os\nimport torch\nprint('ran', sys.argv[1:], os.environ['TRAINRUN_RANK'], flush=True)\n"
                      "sys.exit(7)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "launcher"), "TRAINRUN_RANK": "5"}
    argv = (sys.executable, str(script), "x")
    guard = _Guard()
    pool = SparePool(guard)
    try:
        assert pool.fill([(argv, str(tmp_path), env)]) == 1 and len(guard.pids) == 1
        spare = pool.take(argv, env)
        assert spare is not None and not spare.ready  # taken at once: torch is still being imported
        proc = spare.hand(Handoff(argv, str(tmp_path), env), ())
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 7, err
        assert out.decode().splitlines() == ["ran ['x'] 5"]
        assert pool.take(argv, env) is None  # the pool had one
    finally:
        pool.close()


@pytest.mark.parametrize("where", ["this machine", "agents"])
def test_idle_spares_end_with_a_sigkilled_launcher(tmp_path, where):
    """The launcher's guardian (this machine) or each agent (which sees its channel end) ends the spares."""
    token = f"tok{uuid.uuid4().hex[:8]}"
    if where == "agents":
        run = LiveRun(["-v", "-H", "far1:1,far2:1", "--min-np", "2", PROBE, token], cwd=tmp_path,
                      env={"WANT_SPARES": "2"}, launcher=PIPE)
    else:
        run = LiveRun(["-v", "-np", "2", "--max-restarts", "1", PROBE, token], cwd=tmp_path, env={"WANT_SPARES": "2"})
    run.wait_for("spares ready", timeout=240)
    run.proc.kill()
    run.finish()
    assert wait_gone(token, 30) == []
    # and the attempt's guardian still removed the MPI world's and the state's segments (the spares' guardian,
    # older, must not take it for one of the launcher's orphans and kill it first)
    deadline = time.monotonic() + 10
    while (left := leftover_segments(run.stderr)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == []
