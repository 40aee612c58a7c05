"""The Job's state (supervisor/jobstate.py): the transition table, pure; and the Job's loop driving it, with a
fake rank group and sink (supervisor/job.py's logic only: the real groups are in tests/process)."""
from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from trainrun.supervisor.job import Job
from trainrun.supervisor.jobstate import JobEvent as E
from trainrun.supervisor.jobstate import JobState as S
from trainrun.supervisor.jobstate import advance
from job_fakes import FakeSink


@pytest.mark.parametrize("state, event, after", [
    (S.STARTING, E.STARTED, S.RUNNING),
    (S.RUNNING, E.STOP, S.STOPPING),
    (S.STARTING, E.STOP, S.STOPPING),           # a group failed while the others started
    (S.RUNNING, E.STOP_AFTER_DUMP, S.STOP_PENDING),
    (S.STOP_PENDING, E.DUMP_DONE, S.STOPPING),
    (S.STOPPING, E.KILL, S.KILLING),            # the grace period ended
    (S.STOP_PENDING, E.KILL, S.KILLING),        # a second Ctrl-C while the stacks are taken
    (S.KILLING, E.KILL, S.KILLING),
    (S.RUNNING, E.ENDED, S.DONE),
    (S.KILLING, E.ENDED, S.DONE),
])
def test_transitions(state, event, after):
    assert advance(state, event) is after


@pytest.mark.parametrize("state, event", [
    (S.STOPPING, E.STOP),             # a second failure: one stop
    (S.STOP_PENDING, E.STOP),
    (S.KILLING, E.STOP),              # no SIGTERM after SIGKILL
    (S.STOPPING, E.STOP_AFTER_DUMP),
    (S.RUNNING, E.DUMP_DONE),         # a dump that ends while the job runs stops nothing
    (S.STOPPING, E.DUMP_DONE),
    (S.KILLING, E.DUMP_DONE),
    (S.RUNNING, E.STARTED),
    (S.DONE, E.STOP),
    (S.DONE, E.KILL),
])
def test_events_that_do_not_apply_leave_the_state(state, event):
    assert advance(state, event) is state


def test_stop_asked_and_signalled():
    assert [s for s in S if s.stop_asked] == [S.STOP_PENDING, S.STOPPING, S.KILLING, S.DONE]
    assert [s for s in S if s.signalled] == [S.STOPPING, S.KILLING, S.DONE]


class _Group:
    """One rank that runs until SIGKILLed; records what the Job asks of it."""

    cleanup_note, may_still_run = None, 0

    def __init__(self, spec):
        self.specs, self.running, self.asked = [spec], 1, []

    def start(self, sel, watchdog, events):
        self.events = events

    def tick(self, now): ...
    def pmi_send(self, rank, data): ...
    def abandon(self): ...
    def close(self, sel): ...
    def wait_closed(self): ...

    def signal(self, sig):
        self.asked.append(signal.Signals(sig).name)

    def dump(self, request, use_py_spy):
        self.asked.append("dump")
        self.request = request

    def kill(self):
        self.asked.append("SIGKILL")
        if self.running:
            self.running = 0
            self.events.on_exit(0, -signal.SIGKILL)


def _job():
    spec = SimpleNamespace(rank=0, host="localhost", assignment=SimpleNamespace(host="localhost", local_rank=0))
    plan = SimpleNamespace(procs=[spec], job=SimpleNamespace(tf_tasks=None))
    group = _Group(spec)
    return Job(plan, FakeSink(), [group], grace=0.0), group


def test_a_stop_during_a_stack_dump_waits_for_the_stacks_then_terms_then_kills():
    job, group = _job()
    seen: list[tuple[S, list[str]]] = []

    def script(now):
        seen.append((job.state, list(group.asked)))
        if len(seen) == 1:
            job.dump("a test")
            job.fail(3, "a test failure")    # the stacks of a failing job are the ones wanted: SIGTERM waits
        elif len(seen) == 2:
            job.on_stacks(group.request, [])  # the stacks came: the stop happens now

    order: list[str] = []
    job.on_tick(script)
    job.on_tick(lambda now: order.append("second"))
    assert job.state is S.STARTING
    result = job.run()

    assert seen[0] == (S.RUNNING, [])
    assert seen[1] == (S.STOP_PENDING, ["dump"])  # no SIGTERM yet
    assert seen[2] == (S.STOPPING, ["dump", "SIGTERM", "SIGCONT"])
    assert group.asked[:4] == ["dump", "SIGTERM", "SIGCONT", "SIGKILL"]  # grace 0: SIGKILL at the next tick
    assert job.state is S.DONE
    assert len(order) == len(seen)  # every hook, every tick
    assert (result.exit_code, result.failure.what) == (3, "a test failure")
    assert result.returncodes == {0: -signal.SIGKILL}
