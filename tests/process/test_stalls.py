"""Collectives that some rank never joins end the job, naming that rank (issue 25 items 0 and 1): a
rank that leaves (returns, sys.exit(0|1), catches an exception and ends, os._exit) while the others
wait in allreduce 'x'; a rank stopped with SIGSTOP (the coordinator, rank 0, or another) in an allreduce
loop. Each job ends by itself within the stall timeout plus teardown (the fixture's timeout, far
beyond, is what a hang would hit), with its first failure's exit code, and nothing is left running.
The stack report names a stopped rank by its /proc state.

Issue 38 item 1: a rank that is alive but never joins (it spins, sleeps, waits on a pipe, or its
DataLoader worker is deadlocked) makes the others raise StallError; the raising ranks then hang in their
own shutdown (MPI_Finalize waits for the absent rank), so the launcher ends the job: stacks, then exit 1
naming the absent rank, within the stall timeout plus the grace period plus 5 s."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_helpers import all_pids, assert_all_gone, base_env, wait_for_pidfiles, worker
from test_diag import QUIET, Reader

from trainrun.diag.stacks import proc_state

pytestmark = pytest.mark.timeout(180)

JOB = worker("stall_job.py")
HANG = worker("diag_job.py")
STALL_S = 3
STALL = {"TRAINRUN_STALL_TIMEOUT": str(STALL_S)}


def summary(stderr: str) -> str:
    """The first-failure line of the launcher's summary."""
    return next((line for line in stderr.splitlines() if line.startswith("trainrun: ") and "stopped all" in line), "")


@pytest.mark.parametrize("how, ended, extra", [
    ("return", "exited 0|left", ()),
    ("exit0", "exited 0|left", ()),
    ("caught", "exited 0|left", ()),
    ("exit1", "exited with code 1|left", ()),  # (trainrun may stop it in MPI_Finalize before its exit is seen)
    ("exit0", "exited 0|left", ("set",)),      # it is also in a process set with rank 2, which waits in 'x'
])
def test_a_rank_that_leaves_fails_the_waiting_ranks_at_once_naming_it(run_trainrun, tmp_path, how, ended, extra):
    """Its runtime shutdown tells the others: their allreduce fails at once (no stall timeout needed),
    and the launcher names the rank that left as the cause."""
    # a stall timeout far beyond the job's: the failure comes from the leaving rank's shutdown, at once (with 3 s,
    # a rank slow to exit on a loaded machine raced it with a StallError, and the summary named the wrong rank)
    run = run_trainrun("-np", 3, sys.executable, JOB, tmp_path, "leave", how, 1, *extra, timeout=60,
                       env=base_env(TRAINRUN_STALL_TIMEOUT="40"))
    err = run.stderr
    assert run.rc == 1, err
    assert "x completed" not in run.stdout
    # (ranks 0 and 2 may reach 'x' in one negotiation or in two: each failure names those it found waiting)
    waiting = r"(ranks 0,2|rank 0|rank 2) waited in allreduce 'x'"
    assert re.search(rf"trainrun: rank 1 stopped: it left \(.*\) while {waiting}", err), err
    assert re.match(rf"trainrun: rank 1 on \S+ \(local rank 1\) ({ended}) while {waiting}", summary(err)), err
    assert_all_gone(all_pids(wait_for_pidfiles(tmp_path, 3)))


def test_a_rank_that_leaves_without_shutting_down_is_named_after_the_stall_timeout(run_trainrun, tmp_path):
    """os._exit(0): the others learn nothing from it; no collective round completes, their runtime says
    so after the stall timeout and the launcher, which saw the exit, names it."""
    run = run_trainrun("-np", 3, sys.executable, JOB, tmp_path, "leave", "os_exit0", 1, timeout=60, env=base_env(**STALL))
    err = run.stderr
    assert run.rc == 1, err
    assert re.match(rf"trainrun: rank 1 on \S+ \(local rank 1\) exited 0 while ranks 0,2 waited in allreduce 'x' "
                    rf"\(no collective round completed for {STALL_S} s\)", summary(err)), err
    assert_all_gone(all_pids(wait_for_pidfiles(tmp_path, 3)))


@pytest.mark.parametrize("victim", [0, 1], ids=["coordinator", "other"])
def test_a_stopped_rank_ends_the_job_within_the_stall_timeout(start_trainrun, tmp_path, victim):
    """SIGSTOP one rank of an allreduce loop: the others' runtime reports that no round completes, the
    launcher takes the stacks (the stopped rank by its state, not a py-spy error) and ends the job."""
    proc = start_trainrun("-np", 3, sys.executable, JOB, tmp_path, "loop", env=base_env(**STALL))
    err = Reader(proc.stderr)
    recs = wait_for_pidfiles(tmp_path, 3, proc=proc, timeout=60)
    time.sleep(0.5)  # in the loop
    signal_at = time.monotonic()
    os.kill(recs[victim]["pid"], signal.SIGSTOP)
    rc = proc.wait(60)
    took = time.monotonic() - signal_at
    text = err.text()
    others = "ranks 1,2" if victim == 0 else "ranks 0,2"
    assert rc == 1, text
    assert re.search(rf"^rank {victim} is stopped \(state T\)$", text, re.M), text  # the stack report
    assert re.search(rf"^trainrun: rank {victim} on \S+ \(local rank {victim}\) is stopped \(state T\) while "
                     rf"{others} waited in allreduce 'step' \(no collective round completed for \d+ s\)", text, re.M), text
    assert "py-spy" not in text, text
    assert took > STALL_S, took  # not before the stall timeout
    assert_all_gone(all_pids(recs))


def test_the_stack_report_names_a_stopped_rank_by_its_state(start_trainrun, tmp_path):
    """SIGUSR1 while a rank is stopped (and the stall timeout far away): "rank 2 is stopped (state T)",
    not "no stack: py-spy: ..."; Ctrl-C then ends the job, the stopped rank included."""
    proc = start_trainrun("-np", 4, sys.executable, HANG, tmp_path, "hang", env=base_env(**QUIET))
    err = Reader(proc.stderr)
    recs = wait_for_pidfiles(tmp_path, 4, proc=proc, timeout=60)
    time.sleep(1.0)  # rank 1 in slow_step, the others in the allreduce
    os.kill(recs[2]["pid"], signal.SIGSTOP)
    while proc_state(recs[2]["pid"]) != "T":  # (the stop takes effect when the kernel next runs it)
        time.sleep(0.01)
    proc.send_signal(signal.SIGUSR1)
    err.wait_for(r"^rank 2 is stopped \(state T\)$")
    assert re.search(r"^ranks 0,3: allreduce <- hang", err.text(), re.M), err.text()
    assert "no stack" not in err.text(), err.text()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(15) == 130
    assert_all_gone(all_pids(recs))


GRACE_S = 3.0  # the launcher's default --grace


@pytest.mark.parametrize("how", ["spin", "sleep", "io", "loader"])
def test_an_alive_rank_that_never_joins_ends_the_job_named_with_its_stack(start_trainrun, tmp_path, how):
    proc = start_trainrun("-np", 3, sys.executable, JOB, tmp_path, "absent", how, 1, env=base_env(**STALL))
    err = Reader(proc.stderr)
    recs = wait_for_pidfiles(tmp_path, 3, proc=proc, timeout=60)
    absent = wait_for_pidfiles(tmp_path, 1, proc=proc, timeout=60, name="absent")[1]
    since = time.monotonic()
    try:
        rc = proc.wait(120)  # the bound a hang would hit
    finally:
        proc.kill()
    took = time.monotonic() - since
    text = err.text()
    assert rc == 1, text
    assert "x completed" not in text
    stack_of_1 = re.search(r"^rank(s [\d,-]*\b1\b[\d,-]*| 1): (\S+)", text, re.M)
    assert stack_of_1 and "stay_absent" in text[stack_of_1.start():], text  # its stack is printed, in stay_absent
    assert re.search(r"^trainrun: rank 1 on \S+ \(local rank 1\) took no part in it \(it runs: its stack is above\) "
                     rf"while ranks 0,2 waited in 'x' \(not submitted by rank 1 within the {STALL_S} s stall "
                     r"timeout\)", text, re.M), text
    assert took < STALL_S + GRACE_S + 5, (took, text)
    assert_all_gone(all_pids(recs) + all_pids({1: absent}))


def test_under_a_bare_mpiexec_a_stall_error_aborts_the_mpi_job(tmp_path):
    """No trainrun launcher to end it: the rank that dies of its StallError calls MPI_Abort at exit (not
    MPI_Finalize, which would wait for the spinning rank for ever), and mpiexec ends every rank."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    before = set(Path("/dev/shm").glob("mpich_shm_*"))
    try:
        proc = subprocess.run([mpiexec, "-n", "2", sys.executable, JOB, str(tmp_path), "absent", "spin", "1"],
                              env=base_env(**STALL), capture_output=True, text=True, timeout=120)
    finally:  # an aborted MPICH job leaves its shared-memory segment, and mpiexec does not remove it
        for segment in set(Path("/dev/shm").glob("mpich_shm_*")) - before:
            segment.unlink(missing_ok=True)
    assert proc.returncode != 0, proc.stderr
    assert "StallError: Stalled for more than 3 s: rank 1 did not submit 'x'" in proc.stderr, proc.stderr
    assert "MPI_Abort(MPI_COMM_WORLD, 1)" in proc.stderr, proc.stderr
    assert_all_gone(all_pids(wait_for_pidfiles(tmp_path, 2)))
