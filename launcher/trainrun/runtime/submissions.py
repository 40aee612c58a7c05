"""The engine's request queue: what user threads hand to the engine, and the flags they share with it.

Owns, under its own lock (`_cv`'s):
- `queued`: requests submitted and not yet taken by the driver (driver.py takes them whole: `take`);
- `names`: the names outstanding on this rank, from submit until their handles complete (`release`);
- `drivers`: callers inside (or promised to enter) a blocking wait -- they drive progress themselves,
  so the background thread stands aside while it is non-zero; `_promised`: submit(caller_waits=True)
  whose wait has not begun yet;
- `closed` (no more submits; the driver stops) and `abort_reason` (abort(): the next round says so);
- `_idle`: the background thread sleeps on the condition (a submit wakes it once per burst).

`queued`, `names`, `drivers`, `closed` and `abort_reason` are public for reading without the lock on
hot paths (a stale read costs one more poll); only this class writes them.
"""
from __future__ import annotations

import threading

from trainrun.runtime.exceptions import HorovodInternalError
from trainrun.runtime.ops import Request

_SHUT_DOWN = "trainrun has been shut down; call init() again to use collectives"

WORK, IDLE, CLOSED = "work", "idle", "closed"  # RequestQueue.await_turn's answers


class RequestQueue:
    def __init__(self, size: int):
        """`size`: ranks of the engine's set (one rank: the background thread has no idle rounds)."""
        self._size = size
        self._lock = threading.RLock()
        self._cv = threading.Condition(self._lock)
        self.queued: list[Request] = []
        self.names: set[str] = set()
        self.drivers = 0
        self._promised = 0
        self.closed = False
        self.abort_reason: str | None = None
        self._idle = False

    # ---- user threads ----------------------------------------------------------------------
    def submit(self, reqs: list[Request], caller_waits: bool, wake: bool, timeline) -> None:
        """Queue requests (see Engine.submit). Raises ValueError for a name already in flight here,
        HorovodInternalError once closed. `timeline`: stamps their submission time when not None."""
        with self._lock:
            if self.closed:
                raise HorovodInternalError(_SHUT_DOWN)
            names = self.names
            if len(reqs) == 1:  # an async op (a gradient hook's): in as few steps as possible
                name = reqs[0].name
                if name in names:
                    _refuse([name])
                names.add(name)
            else:
                new = [r.name for r in reqs]
                dup = names.intersection(new) or (len(set(new)) < len(new) and new)
                if dup:
                    _refuse(dup)
                names.update(new)
            if timeline is not None:
                now = timeline.now()
                for r in reqs:
                    r.submitted = now
            self.queued.extend(reqs)
            if caller_waits:
                self.drivers += 1
                self._promised += 1
            elif self._idle and (wake or self._size == 1):
                self._idle = False  # one wake-up per burst of submits: the thread takes the whole queue
                self._cv.notify_all()

    def enter_wait(self) -> None:
        """A caller begins a blocking wait (it drives): counted in `drivers`, unless submit promised it."""
        with self._lock:
            if self._promised:
                self._promised -= 1
            else:
                self.drivers += 1

    def leave_wait(self) -> None:
        """A caller's blocking wait ended; the last one to leave work behind wakes the background thread."""
        with self._lock:
            self.drivers -= 1
            if not self.drivers and (self.queued or self.names):
                self._cv.notify_all()

    def adopt(self, name: str) -> None:
        """The lone-op path hands its op to the driver: `name` is outstanding, and its caller's
        wait is promised (as submit(caller_waits=True))."""
        with self._lock:
            self.names.add(name)
            self.drivers += 1
            self._promised += 1

    def abort(self, reason: str) -> None:
        """Mark this rank as stopping; wakes the background thread to carry it in the next round."""
        with self._lock:
            self.abort_reason = reason
            self._cv.notify_all()

    # ---- the driver and completion ---------------------------------------------------------
    def take(self) -> list[Request]:
        """The queued requests, whole, leaving the queue empty."""
        with self._lock:
            new, self.queued = self.queued, []
        return new

    def release_one(self, name: str) -> None:
        """`name` completed: free it for reuse (before its handle shows done)."""
        with self._lock:
            self.names.discard(name)

    def release(self, names) -> None:
        with self._lock:
            self.names.difference_update(names)

    def close(self) -> None:
        """No more submits; the background thread ends."""
        with self._lock:
            self.closed = True
            self._cv.notify_all()

    # ---- the background thread -------------------------------------------------------------
    def await_turn(self, timeout: float | None, busy) -> str:
        """Block until the background thread should drive: CLOSED, WORK (something outstanding and no
        caller driving), or IDLE (`timeout` passed with nothing to do). `busy()`: the driver has a
        round in flight (work too)."""
        with self._lock:
            while not self.closed and (self.drivers or not self._has_work(busy)):
                self._idle = True
                woken = self._cv.wait(timeout)
                self._idle = False
                if not woken and not self.drivers and not self._has_work(busy):
                    return IDLE
            return CLOSED if self.closed else WORK

    def _has_work(self, busy) -> bool:
        return bool(self.queued or self.names or busy()) or self.abort_reason is not None

    def nap(self, seconds: float) -> None:
        """The background thread sleeps up to `seconds`, woken early by a submit."""
        with self._lock:
            self._idle = True
            self._cv.wait(seconds)
            self._idle = False


def _refuse(names) -> None:
    raise ValueError(f"Requested a collective on tensor name(s) {sorted(set(names))} while an operation "
                     "with the same name is still in flight on this rank; names must be unique")
