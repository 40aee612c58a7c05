"""The engine's background thread: drives progress while no caller does.

It sleeps on the request queue (RequestQueue.await_turn) until there is work and no caller is
blocked in a wait (callers drive for themselves), then takes the driver's lock and calls
`Driver.progress`, yielding the CPU for BACKGROUND_SPIN_S after its last progress (by the waiting
policy's rule, as waiter.Backoff), then sleeping. With nothing to do for IDLE_S, and no round run
meanwhile, it still takes part in one round (`progress(idle=True)`), so that phases (stall errors,
abort) reach every rank and rank 0 can say which rank did not submit what. Its data transfers
yield the CPU between polls (waiting.TransferWait, bound to this thread when it starts).
Owns the thread; its loop state lives in `_run`.
"""
from __future__ import annotations

import os
import threading

from trainrun.runtime.driver import Driver
from trainrun.runtime.submissions import CLOSED, IDLE, RequestQueue
from trainrun.runtime.timing import BACKGROUND_SPIN_S, IDLE_S
from trainrun.runtime.waiter import Backoff
from trainrun.runtime.waiting import TransferWait


class Background:
    def __init__(self, *, queue: RequestQueue, driver: Driver, policy, transfer_wait: TransferWait, size: int):
        self._queue, self._driver, self._policy, self._transfer_wait = queue, driver, policy, transfer_wait
        self._idle_s = IDLE_S if size > 1 else None  # (one rank: no idle rounds)
        self._thread: threading.Thread | None = threading.Thread(target=self._run, name="trainrun-engine", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """Not yet joined (stop/abandon)."""
        return self._thread is not None

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end (after the queue closed, or an abort's last round); True once it
        has, and from then on `running` is False."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        if thread.is_alive():
            return False
        self._thread = None
        return True

    def _run(self) -> None:
        self._transfer_wait.bind_background()
        queue, driver = self._queue, self._driver
        backoff = Backoff(self._policy, BACKGROUND_SPIN_S)
        seen = -1
        while True:
            idle_round = False
            while True:
                turn = queue.await_turn(self._idle_s, driver.in_flight)
                if turn is not IDLE:
                    break
                if driver.rounds != seen:  # rounds ran meanwhile (ops): every rank takes part already
                    seen = driver.rounds
                    continue
                idle_round = True  # take part in a round: others may need this rank's answer
                seen = driver.rounds + 1  # (that round itself is no sign of activity)
                break
            if turn is CLOSED:
                return
            if not driver.lock.acquire(blocking=False):
                continue
            try:
                progressed = driver.progress(idle_round)
            finally:
                driver.lock.release()
            if progressed:
                backoff.reset()
                continue
            delay = backoff.delay()
            if delay:
                queue.nap(delay)
            else:
                os.sched_yield()
