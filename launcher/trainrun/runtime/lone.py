"""The lone-op path: the latency of one blocking allreduce when nothing else is outstanding here.

A lone op with a cached signature needs no queue, no background thread and no Request bookkeeping:
the caller's thread takes the drive lock, has the driver post a round with that op alone
(Driver.solo_round) and, when every rank sent exactly the same (AND == OR == this op), runs the
reduction inline on the host plane. When the round shows the others have more to agree on, or a
peer is late, the op becomes an ordinary request of the driver's (RequestQueue.adopt, Driver.adopt)
and the caller waits for it as for any other (Waiter.wait_all). Both blocking entries use it:
`Engine.run` of one Request and `Engine.allreduce_now` (a CPU allreduce given as arrays, with no
Request unless it must wait).

Owns no state between calls. Argument checks stay with `RequestQueue.submit`: this path applies
only while this rank has nothing outstanding (so no name can clash) and the engine is open;
otherwise the caller takes the general path, which checks.
"""
from __future__ import annotations

from time import perf_counter_ns

from trainrun.runtime.cache import ResponseCache
from trainrun.runtime.dispatch import Dispatch
from trainrun.runtime.driver import Driver
from trainrun.runtime.exceptions import HorovodInternalError
from trainrun.runtime.messages import Meta
from trainrun.runtime.meter import Meter
from trainrun.runtime.ops import Request
from trainrun.runtime.submissions import RequestQueue
from trainrun.runtime.timing import WAITER_SPIN_S

# a lone op whose solo round completed within this long after it was posted counts as this rank's
# arriving last (every rank sends the op in its one round, so the round bits cannot tell): a peer that
# was already waiting answers in microseconds; one that had not yet posted keeps this rank far longer
LONE_LAST_NS = 1_000_000


class LoneOp:
    def __init__(self, *, queue: RequestQueue, driver: Driver, cache: ResponseCache, dispatch: Dispatch,
                 meter: Meter, policy, wait_all, timeline):
        """`policy`: the waiting policy (how long the solo round is polled); `wait_all(handles)`: the
        Waiter's, for an op handed to the driver; `timeline` not None turns the path off (its spans
        need the general path)."""
        self._queue, self._driver, self._meter = queue, driver, meter
        self._ids = cache.ids          # (the cache's dict: the same object for the cache's life)
        self._host = dispatch.host
        self._reduce = dispatch.reduce
        self._drive = driver.lock
        self._policy = policy
        self._wait_all = wait_all
        self._off = timeline is not None
        self._spin_fn = self._spin  # (bound once: passed to every solo round)

    def _spin(self, age: float) -> bool:
        return self._policy.spin(age, WAITER_SPIN_S)

    def run(self, meta: Meta, req: Request | None, send=None, recv=None) -> bool:
        """Run the allreduce `meta` describes by the lone-op path: `req`, or (req None) `recv` = op over
        ranks of `send` (None: in place), a CPU array of a wire dtype without prescale (the caller
        checks: Engine.allreduce_now). Returns False, having done nothing, where the path does not
        apply; True once the op is done (a Request's result in its handle). Raises like Engine.run."""
        cid = self._ids.get(meta)
        queue = self._queue
        if cid is None or queue.names or queue.queued or self._off or not self._drive.acquire(blocking=False):
            return False
        driver, meter = self._driver, self._meter
        adopted = False
        t0 = perf_counter_ns() if meter.on else 0
        try:
            if not driver.quiet():
                return False
            if driver.solo_round(cid, self._spin_fn):  # every rank has this op and nothing else: run it
                if t0:  # (wire/perf_line.py) its round completed at once: this rank came last
                    waited = perf_counter_ns() - t0
                    meter.wait_ns += waited
                    meter.waits += 1
                    meter.collectives += 1
                    meter.last += waited < LONE_LAST_NS
                if req is None:
                    if t0:
                        meter.reduced_bytes += recv.nbytes
                    self._host.allreduce_arrays(send, recv, meta.op, meta.postscale)
                else:
                    req.handle.result = self._reduce([req.name], [req])[0]
                    req.handle.done = True
                return True
            if t0:  # it waited for a peer: not last (the round bits say so too: no new bit next round)
                meter.wait_ns += perf_counter_ns() - t0
            # the others had more to agree on, or are late: from here on an ordinary request
            if req is None:
                req = Request("allreduce", meta.name, recv if send is None else send, recv, meta.shape, meta.dtype,
                              meta.op, 1.0, meta.postscale)
            queue.adopt(req.name)  # (this caller's wait_all below is promised)
            adopted = True
            driver.adopt(req, cid, bool(t0))
        except Exception as e:  # as in Driver.progress
            driver.broken(e)
            if not adopted:  # not the driver's: nothing else will fail it
                raise HorovodInternalError(f"trainrun engine failed: {type(e).__name__}: {e}") from e
        finally:
            self._drive.release()
        assert req is not None, "adopted: the caller's request, or the one made for it above"
        self._wait_all([req.handle])
        return True
