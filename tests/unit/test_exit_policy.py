"""supervisor/exit_policy.py and attempt.py: the verdicts on a rank's end, pure (no processes); and the Job
(supervisor/job.py) carrying verdicts out, with fake rank groups and sink."""
from __future__ import annotations

import signal
import time
from types import SimpleNamespace

from trainrun.wire.control_protocol import RESET_EXIT_CODE
from trainrun.plan.roles import Task
from trainrun.elasticjob.attempt import RESET_WAIT, SETTLE, WATCH_EVERY, AttemptPolicy
from trainrun.supervisor.exit_policy import Done, Fail, Ignore, RankExit, Restart, StaticPolicy
from trainrun.supervisor.job import Job
from trainrun.supervisor.jobstate import JobState
from trainrun.supervisor.ps_policy import PsPolicy
from trainrun.elasticjob.policy import STARTUP_WINDOW, deterministic
from job_fakes import FakeSink


def ended(rank=0, rc=1, at=100.0, **kw):
    return RankExit(rank, rc, f"h{rank}", f"exited with code {rc}", at, **kw)


# StaticPolicy
def test_a_static_job_fails_on_any_failure_but_its_own_teardown():
    p = StaticPolicy()
    assert p.on_exit(ended(rc=0)) == Ignore()
    assert p.on_exit(ended(rc=3)) == Fail()
    assert p.on_exit(ended(rc=-9)) == Fail()               # killed, not by the launcher
    assert p.on_exit(ended(rc=-15, ours=True)) == Ignore()  # the launcher's SIGTERM
    assert p.on_exit(ended(rc=1, state=JobState.STOPPING)) == Fail()  # recorded as a consequence by the Job


# AttemptPolicy
def test_a_start_up_failure_settles_before_the_others_are_stopped():
    p = AttemptPolicy(started=100.0)
    assert p.on_exit(ended(0, 1, at=101.0)) == Fail(stop_others_in=SETTLE)
    assert p.failed_host == "h0"
    assert p.on_exit(ended(1, 1, at=101.5, failed=True)) == Fail(stop_others_in=SETTLE)
    assert p.failed_host == "h0"  # the first failure's host, not a later one's


def test_no_settling_once_the_world_formed_or_the_window_passed_or_for_a_signal():
    assert AttemptPolicy(started=100.0).on_exit(ended(rc=1, at=101.0, world_formed=True)) == Fail()
    assert AttemptPolicy(started=100.0).on_exit(ended(rc=1, at=100.0 + STARTUP_WINDOW)) == Fail()
    assert AttemptPolicy(started=100.0).on_exit(ended(rc=-9, at=101.0)) == Fail()
    stopping = AttemptPolicy(started=100.0)
    assert stopping.on_exit(ended(rc=-15, at=101.0, state=JobState.STOPPING, ours=True)) == Ignore()
    assert stopping.failed_host is None  # the launcher's teardown names no host


def test_a_reset_exit_is_honoured_only_after_the_notice():
    asked: list[float] = []
    notices: list[dict] = []
    answer: dict | None = None

    def changed():
        asked.append(len(asked))
        return answer

    p = AttemptPolicy(started=100.0)
    p.watch_hosts(changed, notices.append)
    assert p.on_exit(ended(0, RESET_EXIT_CODE, at=120.0, world_formed=True)) == Fail()  # no notice: a failure
    p.tick(200.0)
    p.tick(200.0 + WATCH_EVERY / 2)  # not asked again so soon
    assert len(asked) == 1 and not p.notified
    answer = {"ts": 1.0, "removed": False}
    p.tick(200.0 + WATCH_EVERY)
    assert p.notified and notices == [answer]
    p.tick(300.0)
    assert len(asked) == 2 and len(notices) == 1  # told once: the watch stops
    assert p.on_exit(ended(1, RESET_EXIT_CODE, at=301.0, world_formed=True)) == Ignore(stop_others_in=RESET_WAIT)
    assert p.reset


def test_a_host_down_names_the_failed_host_unless_the_job_already_failed_or_stops():
    p = AttemptPolicy()
    p.on_host_down("h2", JobState.RUNNING, failed=True)
    p.on_host_down("h3", JobState.STOPPING, failed=False)
    assert p.failed_host is None
    p.on_host_down("h4", JobState.RUNNING, failed=False)
    assert p.failed_host == "h4"


def test_the_attempt_records_how_every_rank_ended_for_the_loop():
    p = AttemptPolicy(started=100.0)
    for rank in range(3):
        p.on_exit(ended(rank, 2, at=101.0 + rank, last_line="ModuleNotFoundError: No module named 'x'", failed=rank > 0))
    assert [(e.rank, e.returncode, e.after) for e in p.ends] == [(0, 2, 1.0), (1, 2, 2.0), (2, 2, 3.0)]
    assert deterministic(p.ends, 3, world_formed=False) is not None  # every rank the same way: not restarted


# the Job carrying verdicts out
class _Group:
    """Ranks that run until told to end (`end`), or until SIGTERM/SIGKILL; records what the Job asks."""

    cleanup_note, may_still_run = None, 0

    def __init__(self, specs):
        self.specs, self.live, self.asked = specs, {s.rank for s in specs}, []

    @property
    def running(self):
        return len(self.live)

    def start(self, sel, watchdog, events):
        self.events = events

    def end(self, rank, rc):
        self.live.discard(rank)
        self.events.on_exit(rank, rc)

    def tick(self, now): ...
    def pmi_send(self, rank, data): ...
    def dump(self, request, use_py_spy): ...
    def abandon(self): ...
    def close(self, sel): ...
    def wait_closed(self): ...

    def restart(self, rank, count):
        self.asked.append(("restart", rank, count))
        self.live.add(rank)

    def signal(self, sig):
        self.asked.append((signal.Signals(sig).name, time.monotonic()))
        if sig == signal.SIGTERM:
            for rank in sorted(self.live):
                self.end(rank, -signal.SIGTERM)

    def kill(self):
        for rank in sorted(self.live):
            self.end(rank, -signal.SIGKILL)


def _job(n, policy=None, tasks=None):
    specs = [SimpleNamespace(rank=r, host=f"h{r}", assignment=SimpleNamespace(host=f"h{r}", local_rank=0)) for r in range(n)]
    plan = SimpleNamespace(procs=specs, job=SimpleNamespace(tf_tasks=tasks))
    group = _Group(specs)
    sink = FakeSink(tail=True)
    return Job(plan, sink, [group], grace=5.0, policy=policy), group, sink


def _script(job, *steps):
    """Run one step per tick of the Job's loop."""
    todo = list(steps)
    job.on_tick(lambda now: todo.pop(0)() if todo else None)


class _Fixed:
    """A policy that answers every exit with the next verdict of a list, then Ignore()."""

    def __init__(self, *verdicts):
        self.verdicts, self.seen = list(verdicts), []

    def on_exit(self, ended):
        self.seen.append(ended)
        return self.verdicts.pop(0) if self.verdicts else Ignore()

    def on_host_down(self, host, state, failed): ...
    def tick(self, now): ...


def test_a_failure_that_settles_stops_the_others_only_after_the_wait():
    job, group, _ = _job(2, _Fixed(Fail(stop_others_in=0.3)))
    _script(job, lambda: group.end(0, 1))
    t0 = time.monotonic()
    result = job.run()
    terms = [t for what, *t in group.asked if what == "SIGTERM"]
    assert len(terms) == 1 and terms[0][0] - t0 >= 0.3
    assert (result.exit_code, result.failure.rank) == (1, 0)
    assert result.failure.what == "rank 0 on h0 (local rank 0) exited with code 1"
    assert result.returncodes == {0: 1, 1: -signal.SIGTERM}


def test_a_policy_is_told_what_the_job_knew():
    policy = _Fixed(Ignore())
    job, group, _ = _job(2, policy)
    _script(job, lambda: group.end(1, 0), lambda: group.end(0, 3))
    job.run()
    first, second = policy.seen[:2]
    assert (first.rank, first.returncode, first.host, first.state, first.failed) == (1, 0, "h1", JobState.RUNNING, False)
    assert (second.how, second.last_line, second.ours) == ("exited with code 3", "rank 0's last line", False)


def test_a_restart_verdict_starts_the_rank_again_and_says_so():
    job, group, sink = _job(2, _Fixed(Restart("trainrun: restarting rank 1", 1)))
    _script(job, lambda: group.end(1, 1), lambda: group.end(1, 0), lambda: group.end(0, 0))
    result = job.run()
    assert ("restart", 1, 1) in group.asked
    assert sink.raw == [b"trainrun: restarting rank 1\n"]
    assert result.exit_code == 0 and result.failure is None


def test_a_parameter_server_job_ends_well_when_the_chief_finishes():
    tasks = (Task("chief", 0), Task("ps", 0), Task("worker", 0))
    job, group, _ = _job(3, PsPolicy(tasks, 1), tasks)
    _script(job, lambda: group.end(0, 0))  # the ps and the worker are stopped: teardown, not a failure
    result = job.run()
    assert result.exit_code == 0 and result.failure is None
    assert result.returncodes == {0: 0, 1: -signal.SIGTERM, 2: -signal.SIGTERM}


def test_a_parameter_server_job_fails_when_its_ps_dies_and_names_its_task():
    tasks = (Task("chief", 0), Task("ps", 0))
    job, group, _ = _job(2, PsPolicy(tasks, 1), tasks)
    _script(job, lambda: group.end(1, -signal.SIGKILL))
    result = job.run()
    assert result.exit_code == 128 + signal.SIGKILL
    assert result.failure.what == "ps 0 (rank 1 on h1) was killed by SIGKILL"


def test_done_and_ignore_with_a_wait_stop_the_job_without_a_failure():
    job, group, _ = _job(2, _Fixed(Done()))
    _script(job, lambda: group.end(0, 0))
    assert job.run().failure is None and group.asked[0][0] == "SIGTERM"
    job, group, _ = _job(2, _Fixed(Ignore(stop_others_in=0.2)))
    _script(job, lambda: group.end(0, RESET_EXIT_CODE))
    t0 = time.monotonic()
    result = job.run()
    assert result.failure is None and result.exit_code == 0
    assert [t for what, t in group.asked if what == "SIGTERM"][0] - t0 >= 0.2
