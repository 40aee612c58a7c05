"""Completing an engine's handles: results or errors onto handles, their names freed for reuse (the
request queue's, submissions.py), and sleeping waiters woken; and why the engine broke, if it did.

Owns `_done_cv` (waiters that sleep between polls wait on it; every completion notifies it while
`_sleepers` is non-zero) and `failure` (public: the error that closed a broken engine, else None).
`finish*` run in the thread that drives (driver.py's lock); `sleep*` in any thread.
"""
from __future__ import annotations

import threading

from trainrun.runtime.exceptions import HorovodInternalError
from trainrun.runtime.ops import Handle, Request
from trainrun.runtime.submissions import RequestQueue


class Completion:
    def __init__(self, queue: RequestQueue):
        self._queue = queue
        self._done_cv = threading.Condition()
        self._sleepers = 0                     # (under _done_cv)
        self.failure: BaseException | None = None

    def finish_reduced(self, reqs: list[Request], results: list) -> None:
        """Complete successful reductions (the common case: one request, in as few steps as possible)."""
        if len(reqs) == 1:
            req = reqs[0]
            handle = req.handle
            handle.result = results[0]
            self._queue.release_one(req.name)  # the name is free before `done` shows: a caller may reuse it at once
            handle.done = True
            if self._sleepers:
                with self._done_cv:
                    self._done_cv.notify_all()
            return
        self.finish(reqs, results, None)

    def finish(self, reqs: list[Request], results: list, error: BaseException | None) -> None:
        """Complete `reqs` with their results, or all with `error`."""
        for r, res in zip(reqs, results):
            h = r.handle
            h.result, h.error = res, error
        self._queue.release([r.name for r in reqs])  # names free before `done` shows (see finish_reduced)
        for r in reqs:
            r.handle.done = True
        if self._sleepers:
            with self._done_cv:
                self._done_cv.notify_all()

    def broken(self, e: Exception) -> BaseException:
        """Record why the engine broke (an MPI or internal failure while driving); returns the error
        every outstanding handle gets."""
        self.failure = HorovodInternalError(f"trainrun engine failed: {type(e).__name__}: {e}")
        return self.failure

    def orphaned(self, handle: Handle) -> None:
        """Complete `handle`, which a broken engine will never complete (it was being executed: in no
        queue any more), with the reason it broke."""
        handle.error = self.failure
        handle.done = True

    def sleep(self, seconds: float, handle: Handle) -> None:
        """Sleep up to `seconds` unless `handle` is done; a completion wakes it."""
        with self._done_cv:
            if not handle.done:
                self._sleepers += 1
                self._done_cv.wait(seconds)
                self._sleepers -= 1

    def sleep_until(self, ready, timeout: float) -> None:
        """Sleep until `ready()` holds (checked at once and at every completion) or `timeout` s pass.
        Counted as a sleeper before `ready()` is read, so a completion after that read notifies it."""
        with self._done_cv:
            self._sleepers += 1
            try:
                if not ready():
                    self._done_cv.wait(timeout)
            finally:
                self._sleepers -= 1
