"""Blocking on handles: a caller that waits drives progress itself (no thread hand-off per op).

`Waiter.wait_all` counts the caller in the request queue's `drivers` (the background thread stands
aside meanwhile), then, per handle, takes the driver's lock and polls `Driver.progress` without
yielding while it makes progress or while the waiting policy lets a wait of that age spin
(WAITER_SPIN_S after the last progress; under TRAINRUN_WAIT=auto only while the host has no more
runnable tasks than cores); after that it sleeps with growing delays on the Completion's condition
(woken by any completion), letting other threads drive in between. Owns no state between calls
but the policy it was given; the wait times go to the Meter.
"""
from __future__ import annotations

import os
import time
from time import perf_counter_ns

from trainrun.runtime.completion import Completion
from trainrun.runtime.driver import Driver
from trainrun.runtime.meter import Meter
from trainrun.runtime.ops import Handle
from trainrun.runtime.submissions import RequestQueue
from trainrun.runtime.timing import MAX_SLEEP_S, WAITER_SPIN_S
from trainrun.runtime.waiting import ROUND_SLEEP_S


class Backoff:
    """How long a poller with nothing to do should wait: 0 (just yield) while `policy` lets a wait
    this long after the last progress spin (`spin_s` at most), then growing sleeps up to MAX_SLEEP_S
    (TRAINRUN_WAIT=spin) or waiting.ROUND_SLEEP_S."""

    def __init__(self, policy, spin_s: float):
        self._policy = policy
        self._spin = spin_s
        self.reset()

    def reset(self) -> None:
        self._since = time.monotonic()

    def delay(self) -> float:
        idle = time.monotonic() - self._since
        policy = self._policy
        if policy.spins:  # TRAINRUN_WAIT=spin: the earlier rule, unchanged
            return 0.0 if idle < self._spin else min(MAX_SLEEP_S, idle / 16)
        return 0.0 if policy.spin(idle, self._spin) else policy.sleep_s(idle, ROUND_SLEEP_S)


class Waiter:
    def __init__(self, *, queue: RequestQueue, driver: Driver, completion: Completion, meter: Meter, policy):
        self._queue, self._driver, self._completion, self._meter = queue, driver, completion, meter
        self._policy = policy

    def wait_all(self, handles: list[Handle]) -> list:
        """Block until every handle completes (driving progress); their results, or the first error."""
        meter = self._meter
        t0 = perf_counter_ns() if meter.on else 0
        queue = self._queue
        queue.enter_wait()
        try:
            for handle in handles:
                self._drive_until(handle)
        finally:
            queue.leave_wait()
            if t0:
                meter.wait_ns += perf_counter_ns() - t0
                meter.waits += 1
        for handle in handles:
            if handle.error is not None:
                raise handle.error
        return [h.result for h in handles]

    def _drive_until(self, handle: Handle) -> None:
        """Drive progress until `handle` is done. The driver lock is held across polls while they make
        progress or are young (WAITER_SPIN_S, and the policy allows it: under auto, not on an
        oversubscribed host): a blocked caller spins like a blocking MPI call would,
        with no yield or lock hand-off per poll (each costs microseconds, a yield on a loaded machine
        far more); after that it polls with growing sleeps and lets other threads drive in between."""
        driver, completion = self._driver, self._completion
        drive, progress = driver.lock, driver.progress
        backoff = None
        while not handle.done:
            if completion.failure is not None:  # broken while this handle's request was being executed
                completion.orphaned(handle)
                break
            if not drive.acquire(blocking=False):
                completion.sleep(MAX_SLEEP_S, handle)   # another thread is driving
                continue
            try:
                last = time.monotonic()
                spin = self._policy.spin
                while not handle.done:
                    if progress():
                        last = time.monotonic()
                        backoff = None
                    elif not spin(time.monotonic() - last, WAITER_SPIN_S):
                        break
            finally:
                drive.release()
            if not handle.done:
                backoff = backoff or Backoff(self._policy, 0.0)
                delay = backoff.delay()
                completion.sleep(delay, handle) if delay else os.sched_yield()
