"""One attempt of an elastic job: its ExitPolicy (supervisor/exit_policy.py), and a watch on the hosts while it
runs. The attempt itself is an ordinary Job (supervisor/job.py) under this policy, assembled as a static job is
(supervisor/assemble.py).

AttemptPolicy judges as StaticPolicy does, except that
- a rank that exits with RESET_EXIT_CODE after the launcher told the ranks that the hosts changed is not a
  failure: the ranks committed and leave to be restarted on the new hosts (`reset`); the others are stopped
  RESET_WAIT s after the first such exit if they have not left by then;
- a failure at start-up (before the MPI world formed, within STARTUP_WINDOW s) is recorded but stops the
  other ranks only after SETTLE s, so that a failure every rank shares (an import error) shows as such;
- it records how each rank ended (`ends`) and which host failed (`failed_host`), for the elastic loop's
  decisions after the attempt (restart_policy.py).

`watch_hosts` makes its `tick` ask the elastic loop (a callback) every WATCH_EVERY s whether the hosts changed;
the first time they did, it notifies every rank (through the agents, and the launcher's own control
channels) and from then on honours their reset exits.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from trainrun.wire.control_protocol import RESET_EXIT_CODE
from trainrun.supervisor.exit_policy import Fail, Ignore, RankExit, StaticPolicy, ExitVerdict
from trainrun.supervisor.jobstate import JobState
from trainrun.elasticjob.policy import STARTUP_WINDOW, RankEnd

SETTLE = 3.0       # seconds the other ranks get to fail on their own after a start-up failure
RESET_WAIT = 10.0  # seconds the other ranks get to leave after the first reset exit, before they are stopped
WATCH_EVERY = 0.5  # seconds between two questions to the elastic loop: did the hosts change?

HostUpdate = dict[str, Any]  # the notice sent to the ranks' control channels (wire/control_protocol.py's UPDATE)


class AttemptPolicy:
    """The exits of one elastic attempt, judged; and what the elastic loop reads afterwards."""

    def __init__(self, started: float | None = None):
        """`started`: time.monotonic() of the attempt's start (default: now)."""
        self.started = time.monotonic() if started is None else started
        self.ends: list[RankEnd] = []        # every rank's end, in the order reported
        self.failed_host: str | None = None  # the host of the failure that stopped the attempt, if a host's
        self.notified = False  # the ranks were told the hosts changed: reset exits are honoured
        self.reset = False     # some rank left with RESET_EXIT_CODE after that
        self._changed: Callable[[], HostUpdate | None] | None = None
        self._notify: Callable[[HostUpdate], None] | None = None
        self._next_watch = 0.0

    def watch_hosts(self, changed: Callable[[], HostUpdate | None], notify: Callable[[HostUpdate], None]) -> None:
        """While the attempt runs, ask `changed()` every WATCH_EVERY s whether the hosts changed; the first
        time it returns an update, call `notify(update)` and honour reset exits from then on."""
        self._changed, self._notify = changed, notify

    def on_exit(self, ended: RankExit) -> ExitVerdict:
        rc = ended.returncode
        self.ends.append(RankEnd(ended.rank, rc, ended.at - self.started, ended.last_line))
        if rc == RESET_EXIT_CODE and self.notified:
            self.reset = True
            return Ignore(stop_others_in=RESET_WAIT)
        first = rc != 0 and not ended.failed and not ended.state.signalled  # this failure stops the attempt
        if first:
            self.failed_host = ended.host
        early = not ended.world_formed and ended.at - self.started < STARTUP_WINDOW
        if rc > 0 and early and not ended.state.signalled:
            return Fail(stop_others_in=SETTLE)
        return StaticPolicy().on_exit(ended)

    def on_host_down(self, host: str, state: JobState, failed: bool) -> None:
        if not failed and not state.signalled:
            self.failed_host = host

    def tick(self, now: float) -> None:
        if self._changed is None or self.notified or now < self._next_watch:
            return
        self._next_watch = now + WATCH_EVERY
        update = self._changed()
        if update is not None:
            self.notified = True
            if self._notify is not None:
                self._notify(update)
