"""Completing an engine's handles: results or errors onto handles, their names freed for reuse, and
sleeping waiters woken; failing everything outstanding when the engine breaks or shuts down.

A mixin of Engine (see Engine.__init__ for the state): `_finish*` run in the thread holding
`_drive`; `_fail_all` also after the background thread has stopped.
"""
from __future__ import annotations

from trainrun.runtime.exceptions import HorovodInternalError
from trainrun.runtime.ops import Request


class Completion:
    def _finish_reduced(self, reqs: list[Request], results: list) -> None:
        """Complete successful reductions (the common case: one request, in as few steps as possible)."""
        if len(reqs) == 1:
            req = reqs[0]
            handle = req.handle
            handle.result = results[0]
            with self._lock:  # the name is free before `done` shows: a caller may reuse it at once
                self._names.discard(req.name)
            handle.done = True
            if self._sleepers:
                with self._done_cv:
                    self._done_cv.notify_all()
            return
        self._finish(reqs, results, None)

    def _finish(self, reqs: list[Request], results: list, error: BaseException | None) -> None:
        """Complete `reqs` with their results, or all with `error`."""
        for r, res in zip(reqs, results):
            h = r.handle
            h.result, h.error = res, error
        with self._lock:  # names free before `done` shows (see _finish_reduced)
            self._names.difference_update(r.name for r in reqs)
        for r in reqs:
            r.handle.done = True
        if self._sleepers:
            with self._done_cv:
                self._done_cv.notify_all()

    def _fail_all(self, error: BaseException) -> None:
        """Fail every request this rank has outstanding, at whatever stage, with `error`."""
        with self._cv:
            left, self._queue = self._queue, []
        left += self._fresh + list(self._bycid.values()) + list(self._announced.values())
        self._fresh, self._bycid, self._mask = [], {}, 0
        self._announced.clear()
        self._finish(left, [None] * len(left), error)

    def _broken(self, e: Exception) -> None:
        """An MPI or internal failure while driving: nothing can be trusted to complete any more. The
        requests being executed when it happened are in no queue any more: their waiters get the same
        error from `_orphaned` (engine._drive_until)."""
        self._failure = HorovodInternalError(f"trainrun engine failed: {type(e).__name__}: {e}")
        with self._cv:
            self._closed = True
        self._fail_all(self._failure)

    def _orphaned(self, handle) -> None:
        """Complete `handle`, which a closed engine will never complete, with the reason it closed."""
        handle.error = self._failure
        handle.done = True
