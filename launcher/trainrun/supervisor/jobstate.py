"""The Job's state (supervisor/job.py) and its transitions, in one table. Pure.

    STARTING -> RUNNING -> STOPPING -> KILLING -> DONE
                   |           ^
                   +-> STOP_PENDING    (a stop asked while a stack dump is in progress)

A stop or a kill may come in any earlier state too (a group that fails while the others start).

- STARTING: the rank groups are being started.
- RUNNING: no stop asked.
- STOP_PENDING: the job must stop (a failure, a signal), but a stack dump is in progress: SIGTERM waits for
  it, because the stacks of a failing job are the ones wanted.
- STOPPING: SIGTERM sent to every rank; SIGKILL when the grace period ends.
- KILLING: SIGKILL sent (the grace period ended, or a second Ctrl-C); hosts that have not reported by the
  kill deadline are given up on.
- DONE: every rank reported and the job is torn down; its result is final.

An event that does not apply in a state leaves the state as it is: a second stop while stopping, a dump that
ends while the job runs, a stop after SIGKILL.
"""
from __future__ import annotations

from enum import Enum


class JobState(Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOP_PENDING = "stop pending"
    STOPPING = "stopping"
    KILLING = "killing"
    DONE = "done"

    @property
    def stop_asked(self) -> bool:
        """The job was asked to stop: a rank's failure from now on is not what made it stop."""
        return self in _STOP_ASKED

    @property
    def signalled(self) -> bool:
        """SIGTERM (or SIGKILL) was sent to the ranks: an exit from now on may be the launcher's doing."""
        return self in _SIGNALLED


_SIGNALLED = frozenset({JobState.STOPPING, JobState.KILLING, JobState.DONE})
_STOP_ASKED = _SIGNALLED | {JobState.STOP_PENDING}


class JobEvent(Enum):
    STARTED = "started"                  # every group was started; the loop begins
    STOP = "stop"                        # stop now: SIGTERM to every rank
    STOP_AFTER_DUMP = "stop after dump"  # stop, once the stack dump in progress is complete
    DUMP_DONE = "dump done"              # no stack dump in progress any more
    KILL = "kill"                        # SIGKILL to every rank
    ENDED = "ended"                      # every rank reported; teardown complete


S, E = JobState, JobEvent
_NEXT: dict[tuple[JobState, JobEvent], JobState] = {
    (S.STARTING, E.STARTED): S.RUNNING,
    (S.STARTING, E.STOP): S.STOPPING,
    (S.RUNNING, E.STOP): S.STOPPING,
    (S.STARTING, E.STOP_AFTER_DUMP): S.STOP_PENDING,
    (S.RUNNING, E.STOP_AFTER_DUMP): S.STOP_PENDING,
    (S.STOP_PENDING, E.DUMP_DONE): S.STOPPING,
    **{(s, E.KILL): S.KILLING for s in (S.STARTING, S.RUNNING, S.STOP_PENDING, S.STOPPING, S.KILLING)},
    **{(s, E.ENDED): S.DONE for s in S},
}
del S, E


def advance(state: JobState, event: JobEvent) -> JobState:
    """The state after `event` in `state` (the same state where the event does not apply)."""
    return _NEXT.get((state, event), state)
