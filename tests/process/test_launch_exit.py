"""Exit codes, fail-fast, --grace, signals to the launcher and the watchdog: nothing of a job outlives it."""
import signal
import sys
import time

import pytest
from trainrun.supervisor.watchdog import POLL_S
from launch_helpers import alive, all_pids, assert_all_gone, assert_none_with, procs_with, wait_for_pidfiles, worker

pytestmark = pytest.mark.timeout(60)

TEARDOWN_S = 5.0  # generous upper bound for "quickly" on a busy 2-core box
JOB_S = 10.0  # a whole short job (start, fail, teardown), far below the --grace 30 it must not wait for


def test_exit_zero(run_trainrun):
    run = run_trainrun("-np", 2, sys.executable, "-c", "pass")
    assert run.rc == 0, run.stderr
    assert run.stderr == ""


def test_exit_code_of_a_rank(run_trainrun):
    run = run_trainrun("-np", 2, sys.executable, "-c", "import os, sys; sys.exit(5 if os.environ['RANK'] == '1' else 0)")
    assert run.rc == 5
    assert "rank 1" in run.stderr and "code 5" in run.stderr


def test_single_rank_exit_code(run_trainrun):
    run = run_trainrun("-np", 1, sys.executable, "-c", "raise SystemExit(42)")
    assert run.rc == 42


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_signal_killed_rank_gives_128_plus_n(run_trainrun, sig):
    code = f"import os; os.kill(os.getpid(), {int(sig)}) if os.environ['RANK'] == '0' else None"
    run = run_trainrun("-np", 2, sys.executable, "-c", code)
    assert run.rc == 128 + sig
    assert sig.name in run.stderr, run.stderr


def test_fail_fast(run_trainrun, tmp_path):
    """Rank 1 exits 3 while the others sleep forever: the launcher exits 3 at once and nothing is left."""
    t0 = time.monotonic()
    # a long grace: ranks that die on SIGTERM must not make the launcher wait for it
    run = run_trainrun("--grace", 30, "-np", 4, worker("job.py"), tmp_path, "--grandchild", "--fail-rank", 1, "--code", 3)
    elapsed = time.monotonic() - t0
    assert run.rc == 3, run.stderr
    assert elapsed < JOB_S, f"fail-fast took {elapsed:.1f}s"
    recs = wait_for_pidfiles(tmp_path, 4, timeout=0)
    assert_all_gone(all_pids(recs), TEARDOWN_S, "ranks or grandchildren survived the job")
    # the summary names the rank, its host and its code, and shows its last stderr lines
    summary = [line for line in run.stderr.splitlines() if not line.startswith("[")]  # not rank output
    text = "\n".join(summary)
    assert "rank 1" in text and "localhost" in text and "code 3" in text, run.stderr
    assert "rank 1 stderr line 15" in text, f"last stderr line missing from the summary:\n{run.stderr}"
    assert "Traceback" not in run.stderr


def test_fail_fast_on_signal_killed_rank(run_trainrun, tmp_path):
    run = run_trainrun("-np", 3, worker("job.py"), tmp_path, "--fail-rank", 2, "--signal", int(signal.SIGKILL))
    assert run.rc == 128 + signal.SIGKILL, run.stderr
    assert "rank 2" in run.stderr and "SIGKILL" in run.stderr
    assert_all_gone(all_pids(wait_for_pidfiles(tmp_path, 3, timeout=0)), TEARDOWN_S)


def test_grace_lets_ranks_clean_up(run_trainrun, tmp_path):
    """Within --grace a rank that handles SIGTERM finishes its clean-up; with --grace 0 it is killed first."""
    kept, cut = tmp_path / "kept", tmp_path / "cut"
    kept.mkdir()
    cut.mkdir()
    run = run_trainrun("--grace", 10, "-np", 2, worker("job.py"), kept, "--term-cleanup", kept / "done",
                       "--fail-rank", 0)
    assert run.rc == 3, run.stderr
    assert (kept / "done.1").read_text() == "cleaned up\n"
    run = run_trainrun("--grace", 0, "-np", 2, worker("job.py"), cut, "--term-cleanup", cut / "done",
                       "--fail-rank", 0)
    assert run.rc == 3, run.stderr
    time.sleep(0.7)  # longer than the clean-up would take, had the rank survived
    assert not (cut / "done.1").exists(), "--grace 0 must SIGKILL without waiting"


def test_grace_then_sigkill_for_rank_ignoring_sigterm(run_trainrun, tmp_path):
    t0 = time.monotonic()
    run = run_trainrun("--grace", 0.5, "-np", 3, worker("job.py"), tmp_path, "--ignore-term", "--grandchild",
                       "--fail-rank", 0, "--code", 7)
    elapsed = time.monotonic() - t0
    assert run.rc == 7, run.stderr
    assert elapsed < JOB_S
    assert_all_gone(all_pids(wait_for_pidfiles(tmp_path, 3, timeout=0)), TEARDOWN_S)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_signal_to_launcher_stops_ranks(start_trainrun, tmp_path, sig, code):
    """The launcher forwards SIGTERM (ranks may clean up), then exits 128+N with nothing left behind."""
    proc = start_trainrun("--grace", 30, "-np", 3, worker("job.py"), tmp_path, "--grandchild",
                          "--term-cleanup", tmp_path / "done")
    recs = wait_for_pidfiles(tmp_path, 3, proc=proc)
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=TEARDOWN_S)
    except Exception:
        pytest.fail(f"launcher did not end after {sig.name}")
    assert proc.returncode == code, err.decode()
    assert_all_gone(all_pids(recs), TEARDOWN_S)
    assert sig.name in err.decode()
    assert "Traceback" not in err.decode()
    assert sorted(p.name for p in tmp_path.glob("done.*")) == ["done.0", "done.1", "done.2"], "ranks got no SIGTERM"


def test_sigint_to_launcher_with_rank_ignoring_sigterm(start_trainrun, tmp_path):
    proc = start_trainrun("--grace", 0.5, "-np", 2, worker("job.py"), tmp_path, "--ignore-term")
    recs = wait_for_pidfiles(tmp_path, 2, proc=proc)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=0.5 + TEARDOWN_S)
    assert proc.returncode == 130
    assert_all_gone(all_pids(recs), TEARDOWN_S)


def test_launcher_sigkilled_watchdog_cleans_up(start_trainrun, tmp_path):
    proc = start_trainrun("-np", 3, worker("job.py"), tmp_path, "--grandchild", "--ignore-term")
    recs = wait_for_pidfiles(tmp_path, 3, proc=proc)
    pids = all_pids(recs)
    assert all(alive(p) for p in pids)
    proc.kill()
    proc.communicate(timeout=5)
    assert_all_gone(pids, TEARDOWN_S, "ranks survived their launcher's SIGKILL")


def test_rank_exit_with_grandchild_holding_output(run_trainrun, tmp_path):
    """A rank that exits 0 leaving a child that holds its stdout open: the job still ends, child killed."""
    code = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
            f"open(r'{tmp_path}/gc', 'w').write(str(p.pid)); print('parent done')")
    t0 = time.monotonic()
    run = run_trainrun("-np", 1, sys.executable, "-c", code)
    assert run.rc == 0, run.stderr
    assert time.monotonic() - t0 < JOB_S
    assert "[0]<stdout>:parent done" in run.stdout
    assert_all_gone([int((tmp_path / "gc").read_text())], TEARDOWN_S)


def test_second_sigint_skips_grace(start_trainrun, tmp_path):
    proc = start_trainrun("--grace", 60, "-np", 2, worker("job.py"), tmp_path, "--ignore-term")
    recs = wait_for_pidfiles(tmp_path, 2, proc=proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    assert proc.poll() is None, "the first SIGINT must leave the SIGTERM-ignoring ranks their grace period"
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=TEARDOWN_S)
    assert proc.returncode == 130
    assert_all_gone(all_pids(recs), TEARDOWN_S)


@pytest.mark.parametrize("end", ["ok", "fail", "launcher-sigkill"])
def test_processes_without_the_jobs_environment_are_killed(start_trainrun, end):
    """Each rank leaves an `env -i setsid` sleeper and a double-forked daemon with an empty environment
    (no mark for the /proc environ sweep, re-parented away from the rank): none of them outlives the job,
    whether it succeeds, fails, or its launcher is SIGKILLed (then the watchdog ends them: it saw them
    adopted by the launcher, a child subreaper). This test process is a subreaper too (conftest.py): the
    orphans of a SIGKILLed launcher come here, so they are counted by their token, not by their parent."""
    import uuid

    token = f"esc{uuid.uuid4().hex[:8]}"
    proc = start_trainrun("-np", 2, sys.executable, worker("escapees.py"), token,
                          "sleep" if end == "launcher-sigkill" else end)
    if end == "launcher-sigkill":
        for _ in range(2):
            assert proc.stdout.readline().endswith(b"up 2\n")
        assert len(procs_with(token)) >= 6  # 2 ranks, 2 x (setsid sleeper, daemon)
        time.sleep(2 * POLL_S)  # the watchdog sees an adopted orphan within POLL_S (its documented limit)
        proc.kill()
    proc.communicate(timeout=JOB_S)
    assert proc.returncode == {"ok": 0, "fail": 3, "launcher-sigkill": -9}[end]
    assert_none_with(token, TEARDOWN_S, "escaped processes of the job")
