"""supervisor/ps_policy.py: which exits of a parameter-server job end it, fail it, or restart a worker."""
from trainrun.plan.roles import Task
from trainrun.supervisor.exit_policy import Done, Fail, Ignore, RankExit, Restart
from trainrun.supervisor.jobstate import JobState
from trainrun.supervisor.ps_policy import PsPolicy

TASKS = (Task("chief", 0), Task("worker", 0), Task("worker", 1), Task("ps", 0), Task("evaluator", 0))


def verdict(policy, rank, rc, **kw):
    return policy.on_exit(RankExit(rank, rc, "h1", f"exited with code {rc}", **kw))


def test_chief_and_evaluator_decide_the_job():
    p = PsPolicy(TASKS, 3)
    assert verdict(p, 0, 0) == Ignore()  # the evaluator has not finished yet
    assert verdict(p, 4, 0) == Done()
    assert verdict(PsPolicy(TASKS[:4], 3), 0, 0) == Done()  # no evaluator: the chief alone
    assert verdict(PsPolicy(TASKS, 3), 0, 3) == Fail()
    assert verdict(PsPolicy(TASKS, 3), 4, 1) == Fail()


def test_after_the_chief_finished_every_end_is_teardown():
    p = PsPolicy(TASKS[:4], 3)
    assert verdict(p, 0, 0) == Done()
    assert verdict(p, 3, -15) == Ignore()  # the ps stopped by the launcher
    assert verdict(p, 1, 1) == Ignore()    # a worker that failed while stopping


def test_a_ps_failing_fails_the_job():
    assert verdict(PsPolicy(TASKS, 3), 3, -9) == Fail()
    assert verdict(PsPolicy(TASKS, 3), 3, 0) == Ignore()


def test_a_dead_worker_is_restarted_up_to_the_limit_per_task():
    p = PsPolicy(TASKS, 2)
    first = verdict(p, 2, 1)
    assert isinstance(first, Restart) and first.restart_count == 1
    assert "worker 1 (rank 2 on h1)" in first.line and "restart 1 of 2" in first.line
    assert isinstance(verdict(p, 1, 1), Restart)  # another task has its own count
    again = verdict(p, 2, 1)
    assert isinstance(again, Restart) and again.restart_count == 2 and p.restart_count(2) == 2
    last = verdict(p, 2, 1)
    assert isinstance(last, Fail) and "--max-restarts 2" in last.note
    assert verdict(p, 1, 0) == Ignore()  # a worker that ended its own loop


def test_no_restarts_allowed():
    assert isinstance(verdict(PsPolicy(TASKS, 0), 1, -9), Fail)


def test_once_the_job_stops_exits_are_judged_as_in_a_static_job():
    p = PsPolicy(TASKS, 3)
    assert verdict(p, 1, 1, state=JobState.STOPPING) == Fail()  # no restart while stopping
    assert verdict(p, 1, -15, state=JobState.STOPPING, ours=True) == Ignore()
    assert verdict(p, 0, 0, state=JobState.STOPPING) == Ignore() and not p.done
