"""supervisor/ps_policy.py: which exits of a parameter-server job end it, fail it, or restart a worker."""
from trainrun.plan.roles import Task
from trainrun.supervisor.ps_policy import PsPolicy

TASKS = (Task("chief", 0), Task("worker", 0), Task("worker", 1), Task("ps", 0), Task("evaluator", 0))


def verdict(policy, rank, rc):
    return policy.on_exit(rank, rc, f"exited with code {rc}", "h1")


def test_chief_and_evaluator_decide_the_job():
    p = PsPolicy(TASKS, 3)
    assert verdict(p, 0, 0).action == "wait"  # the evaluator has not finished yet
    assert verdict(p, 4, 0).action == "done"
    assert verdict(PsPolicy(TASKS[:4], 3), 0, 0).action == "done"  # no evaluator: the chief alone
    assert verdict(PsPolicy(TASKS, 3), 0, 3).action == "fail"
    assert verdict(PsPolicy(TASKS, 3), 4, 1).action == "fail"


def test_a_ps_failing_fails_the_job():
    assert verdict(PsPolicy(TASKS, 3), 3, -9).action == "fail"
    assert verdict(PsPolicy(TASKS, 3), 3, 0).action == "wait"


def test_a_dead_worker_is_restarted_up_to_the_limit_per_task():
    p = PsPolicy(TASKS, 2)
    first = verdict(p, 2, 1)
    assert first.action == "restart" and "worker 1 (rank 2 on h1)" in first.line and "restart 1 of 2" in first.line
    assert verdict(p, 1, 1).action == "restart"  # another task has its own count
    assert verdict(p, 2, 1).action == "restart" and p.restart_count(2) == 2
    last = verdict(p, 2, 1)
    assert last.action == "fail" and "--max-restarts 2" in last.line
    assert verdict(p, 1, 0).action == "wait"  # a worker that ended its own loop


def test_no_restarts_allowed():
    assert verdict(PsPolicy(TASKS, 0), 1, -9).action == "fail"
