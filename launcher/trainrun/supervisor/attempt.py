"""One attempt of an elastic job: the Job (job.py) with three differences, and a watch on the hosts while it
runs. (assemble.py puts an attempt together, as it does a static job.)

AttemptJob differs from Job in that
- a rank that exits with RESET_EXIT_CODE after the launcher told the ranks that the hosts changed is not a
  failure: the ranks committed and leave to be restarted on the new hosts (`reset`);
- a failure at start-up (before the MPI world formed, within STARTUP_WINDOW s) does not stop the other
  ranks at once but after SETTLE s, so that a failure every rank shares (an import error) shows as such;
- it records how each rank ended (RankEnd) and which host failed, for the elastic policy.

`watch_hosts` registers a tick hook with the Job: every WATCH_EVERY s it asks the elastic loop (a callback)
whether the hosts changed; the first time they did, it notifies every rank (through the agents, and the
launcher's own control channels) and from then on honours their reset exits.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from trainrun.elastic.protocol import RESET_EXIT_CODE
from trainrun.supervisor.restart_policy import STARTUP_WINDOW, RankEnd
from trainrun.supervisor.groups import ExitInfo
from trainrun.supervisor.job import Job
from trainrun.supervisor.result import Failure, exit_code_of

SETTLE = 3.0       # seconds the other ranks get to fail on their own after a start-up failure
RESET_WAIT = 10.0  # seconds the other ranks get to leave after the first reset exit, before they are stopped
WATCH_EVERY = 0.5  # seconds between two questions to the elastic loop: did the hosts change?


class AttemptJob(Job):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.started = time.monotonic()
        self.ends: list[RankEnd] = []
        self.failed_host: str | None = None
        self.notified = False   # the ranks were told the hosts changed: reset exits are honoured
        self.reset = False      # some rank left with RESET_EXIT_CODE after that
        self._settle_until: float | None = None
        self._reset_until: float | None = None
        self.on_tick(self._end_waits)

    @property
    def world_formed(self) -> bool:
        return self.world is not None and len(self.world.initialized) == len(self.plan.procs)

    def on_exit(self, rank: int, returncode: int, info: ExitInfo | None = None) -> None:
        now = time.monotonic()
        tail = self.sink.stderr_tail(rank)
        self.ends.append(RankEnd(rank, returncode, now - self.started, tail[-1].strip() if tail else ""))
        if returncode == RESET_EXIT_CODE and self.notified:
            self.result.returncodes[rank] = returncode
            self.reset = True
            self._reset_until = self._reset_until or now + RESET_WAIT
            return
        early = not self.world_formed and now - self.started < STARTUP_WINDOW
        if returncode > 0 and early and not self.state.signalled:
            self.result.returncodes[rank] = returncode
            how = f"exited with code {returncode}"
            failure = Failure(exit_code_of(returncode), f"{self._where(rank)} {how}", rank, tuple(tail),
                              info.at if info else time.time())
            self._failures.append(failure)  # the Job settles the first failure by time at the end
            if self.result.failure is None:
                self.result.failure = failure
                self.result.exit_code = exit_code_of(returncode)
                self.failed_host = self._specs[rank].host
            self._settle_until = self._settle_until or now + SETTLE
            return
        if returncode != 0 and self.result.failure is None and not self.state.signalled:
            self.failed_host = self._specs[rank].host
        super().on_exit(rank, returncode, info)

    def on_host_lost(self, host: str, message: str) -> None:
        if self.result.failure is None and not self.state.signalled:
            self.failed_host = host
        super().on_host_lost(host, message)

    def on_host_failed(self, host: str, message: str, exit_code: int) -> None:
        if self.result.failure is None and not self.state.signalled:
            self.failed_host = host
        super().on_host_failed(host, message, exit_code)

    def watch_hosts(self, changed: Callable[[], dict | None], notify: Callable[[dict], None]) -> None:
        """While the attempt runs, ask `changed()` every WATCH_EVERY s whether the hosts changed; the first
        time it returns an update, call `notify(update)` and honour reset exits from then on."""
        next_at = 0.0

        def watch(now: float) -> None:
            nonlocal next_at
            if self.notified or now < next_at:
                return
            next_at = now + WATCH_EVERY
            update = changed()
            if update is not None:
                self.notified = True
                notify(update)

        self.on_tick(watch)

    def _end_waits(self, now: float) -> None:
        """A tick hook: end the settle and reset waits."""
        if self._settle_until is not None and now >= self._settle_until:
            self._settle_until = None
            self.stop()
        if self._reset_until is not None and now >= self._reset_until:
            self._reset_until = None
            self.stop()
