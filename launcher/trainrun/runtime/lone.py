"""The lone-op path: the latency of one blocking allreduce when nothing else is outstanding here.

A lone op with a cached signature needs no queue, no background thread and no Request bookkeeping:
the caller's thread posts a round with that op alone and, when every rank sent exactly the same
(AND == OR == this op), runs the reduction inline. When the round shows the others have more to
agree on, or a peer is late, the op becomes an ordinary request of the driver's (driver.py) and the
caller waits for it as for any other. Both blocking entries use it: `Engine.run` of one Request and
`Engine.allreduce_now` (a CPU allreduce given as arrays, with no Request unless it must wait).

A mixin of Engine (see Engine.__init__ for the state). Argument checks stay with `Engine.submit`:
this path applies only while this rank has nothing outstanding (so no name can clash) and the engine
is open; otherwise the caller takes the general path, which checks.
"""
from __future__ import annotations

import time
from time import perf_counter_ns

from trainrun.runtime.exceptions import HorovodInternalError
from trainrun.runtime.messages import Meta
from trainrun.runtime.ops import Request
from trainrun.runtime.timing import WAITER_SPIN_S
from trainrun.runtime.waiting import POLICY

# a lone op whose solo round completed within this long after it was posted counts as this rank's
# arriving last (every rank sends the op in its one round, so the round bits cannot tell): a peer that
# was already waiting answers in microseconds; one that had not yet posted keeps this rank far longer
LONE_LAST_NS = 1_000_000


class LoneOp:
    def _lone(self, meta: Meta, req: Request | None, send=None, recv=None) -> bool:
        """Run the allreduce `meta` describes by the lone-op path: `req`, or (req None) `recv` = op over
        ranks of `send` (None: in place), a CPU array of a wire dtype without prescale (the caller
        checks: Engine.allreduce_now). Returns False,
        having done nothing, where the path does not apply; True once the op is done (a Request's
        result in its handle). Raises like Engine.run."""
        cid = self._cache.ids.get(meta)
        if cid is None or self._names or self._queue or self._timeline is not None \
                or not self._drive.acquire(blocking=False):
            return False
        adopted = False
        t0 = perf_counter_ns() if self.measure else 0
        try:
            if not self._quiet():
                return False
            if self._solo_round(cid):  # every rank has this op and nothing else: run it
                if t0:  # (diag/perf.py) its round completed at once: this rank came last
                    waited = perf_counter_ns() - t0
                    self.wait_ns += waited
                    self.waits += 1
                    self.collectives += 1
                    self.last += waited < LONE_LAST_NS
                if req is None:
                    self._coll.allreduce_arrays(send, recv, meta.op, meta.postscale)
                    if t0:
                        self.reduced_bytes += recv.nbytes
                else:
                    req.handle.result = self._reduce([req.name], [req])[0]
                    req.handle.done = True
                return True
            if t0:  # it waited for a peer: not last (the round bits say so too: no new bit next round)
                self.wait_ns += perf_counter_ns() - t0
                self._sent = self._sent_prev = 1 << cid
            # the others had more to agree on, or are late: from here on an ordinary request
            if req is None:
                req = Request("allreduce", meta.name, recv if send is None else send, recv, meta.shape, meta.dtype,
                              meta.op, 1.0, meta.postscale)
            req.cid = cid
            with self._lock:
                self._names.add(req.name)
                self._drivers += 1
                self._promised += 1  # this caller's wait_all below
            self._bycid[cid] = req
            self._mask |= 1 << cid
            adopted = True
            if self._inflight is None:  # the round completed: run what it agreed
                self._agreed()
        except Exception as e:  # as in Driver._progress
            self._broken(e)
            if not adopted:  # not the driver's: nothing else will fail it
                raise HorovodInternalError(f"trainrun engine failed: {type(e).__name__}: {e}") from e
        finally:
            self._drive.release()
        self.wait_all([req.handle])
        return True

    def _quiet(self) -> bool:
        """Nothing in the driver's hands (caller holds _drive): a lone op may take this path."""
        return self._inflight is None and not (self._closed or self._fresh or self._bycid or self._announced) \
            and self._abort_reason is None and (self._coord is None or not self._wants_phase())

    def _solo_round(self, cid: int) -> bool:
        """Post a round with op `cid` alone and no flags, and spin for it as a blocking MPI call would,
        up to WAITER_SPIN_S while waiting.POLICY lets it (the general loop backs off after that). Caller holds _drive, _quiet(). True when
        every rank sent the same (the op runs now); else the round is either completed (the caller
        runs `_agreed`) or still in flight (`_inflight`, for the general loop)."""
        send = self._cache.solo(cid)
        request = self._start_round(send)
        polls, start = 0, None
        while not request.Test():
            polls += 1
            if not polls & 63:
                now = time.monotonic()
                start = start or now
                if not POLICY.spin(now - start, WAITER_SPIN_S):
                    return False
        self._inflight = None
        self._rounds += 1
        if self._round_recv == send:  # AND == OR == this op alone reduces to what every rank sent
            self._partial_since = None
            return True
        return False
