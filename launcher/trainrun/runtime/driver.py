"""The agreement driver (engine.py explains rounds and phases): one `progress` step takes in queued
requests, posts or tests this rank's round, and runs what a completed round agreed -- cached ops
every rank has, then, if any rank asked, a negotiation phase with the coordinator.

Owns, all touched only by the thread holding `lock` (the drive lock; any thread may take it):
- the requests by stage: `_fresh` (taken in, signature not cached), `_bycid` (cached: in every
  round's mask `_mask`), `_announced` (sent to the coordinator, waiting for a response); `_joining`;
- the round in flight (`_inflight`, its buffers) and `rounds` (completed: the background thread's
  and the stuck watchdog's sign of activity); the abort flag sent; `shutdown_ok` (every rank reached
  shutdown's response: collectives are safe at teardown);
- the control communicator's side: the RoundPort and, on rank 0, the Coordinator (negotiation.py)
  and `_partial_since`;
- the straggler bits of the last two rounds (`_sent`, `_sent_prev`; counts go to the Meter).
Hands off to: the RequestQueue (take, close), the ResponseCache (ids, numbering, fusion plans),
the Dispatch (the data planes), the Completion (handles), the Meter.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, cast

from trainrun.runtime import rounds
from trainrun.runtime.cache import ResponseCache
from trainrun.runtime.completion import Completion
from trainrun.runtime.dispatch import Dispatch
from trainrun.runtime.exceptions import HorovodInternalError, StallError, TensorMismatchError
from trainrun.runtime.messages import Meta, Response
from trainrun.runtime.meter import Meter
from trainrun.runtime.negotiation import Coordinator
from trainrun.runtime.ops import GROUP, Request
from trainrun.runtime.round_port import RoundPort
from trainrun.runtime.submissions import RequestQueue

_ERRORS = {"mismatch": TensorMismatchError, "stall": StallError, "abort": HorovodInternalError,
           "left": HorovodInternalError}


class Driver:
    def __init__(self, ctrl, rank: int, *, queue: RequestQueue, cache: ResponseCache, dispatch: Dispatch,
                 completion: Completion, meter: Meter, coordinator: Coordinator | None, threshold: int,
                 tick: float, timeline):
        """Rounds and phases on `ctrl` (the engine's control communicator); `coordinator` on rank 0 only;
        `threshold`: the fusion threshold every rank agreed on; `tick`: how long an op may be ready on
        some ranks only before rank 0 pulls it into a phase."""
        self.rank = rank
        self._ctrl = ctrl
        self._port = RoundPort(ctrl)  # the rounds' persistent MPI requests (round_port.py)
        self._queue, self._cache, self._dispatch, self._completion, self._meter = queue, cache, dispatch, completion, meter
        self._coord = coordinator
        self._threshold, self._tick, self._timeline = threshold, tick, timeline
        self.lock = threading.Lock()             # held by whichever thread drives progress
        self._fresh: list[Request] = []
        self._bycid: dict[int, Request] = {}
        self._mask = 0
        self._announced: dict[str, Request] = {}
        self._joining = False
        self._abort_sent = False
        self._inflight: Any = None               # the MPI request of the round in flight, if any;
        self._round_send: bytes | None = None    # that round's buffers (the last round's, after it)
        self._round_recv: Any = None
        self._round_words = 0
        self.rounds = 0
        self._partial_since: float | None = None
        self.shutdown_ok = False
        self._sent = self._sent_prev = 0

    # ---- the general loop (caller holds `lock`) ---------------------------------------------------
    def progress(self, idle: bool = False) -> bool:
        """One step: take in new requests, post or test the round, run what it agreed. `idle`: post a
        round even with nothing to do (the background thread's idle round)."""
        try:
            return self._step(idle)
        except Exception as e:
            self.broken(e)
            return True

    def _step(self, idle: bool) -> bool:
        """The hot path of every operation: kept free of allocations and lock round-trips when there
        is nothing to do. Returns whether anything moved (a round that agreed nothing does not count)."""
        queue = self._queue
        if queue.closed:
            return False
        progressed = False
        if queue.queued:
            self._intake()
            progressed = True
        request = self._inflight
        if request is None:
            if not (self._bycid or self._fresh or self._announced or idle) and queue.abort_reason is None:
                return progressed
            request = self._post()
        if not request.Test():
            return progressed
        self._inflight = None
        self.rounds += 1
        return self._agreed() or progressed

    def in_flight(self) -> bool:
        """A round is in flight (read from other threads without the lock)."""
        return self._inflight is not None

    def _intake(self) -> None:
        new = self._queue.take()
        ids, bycid, mask = self._cache.ids, self._bycid, self._mask
        for r in new:
            cid = r.cid = ids.get(r.meta())
            if cid is None:
                self._fresh.append(r)
                if r.kind == "join":
                    self._joining = True
            else:
                bycid[cid] = r
                mask |= 1 << cid
        self._mask = mask

    def _post(self):
        """Start this rank's next round (rounds.py) with what it has ready and needs."""
        flags = 0
        if self._fresh:
            flags |= rounds.NEW
        if self._joining:
            flags |= rounds.JOINED
        if self._queue.abort_reason is not None and not self._abort_sent:
            flags |= rounds.ABORT
        if self._coord is not None and self._wants_phase():
            flags |= rounds.PHASE
        self._sent_prev, self._sent = self._sent, self._mask
        return self._start_round(rounds.encode(flags, self._mask, self._cache.words))

    def _start_round(self, send: bytes):
        """Post a round contributing `send` (rounds.encode of the cache's current size): it becomes
        the round in flight. Returns its MPI request."""
        n = self._cache.words
        request, self._round_recv = self._port.start(send, n)
        self._round_send, self._round_words, self._inflight = send, n, request
        return request

    def _wants_phase(self) -> bool:
        """Rank 0: a phase is due to match cached ops the coordinator holds elsewhere, to pull ops
        that are ready on some ranks only for a tick (their stall clock starts there), or to check stalls."""
        coord = self._coord
        assert coord is not None, "only rank 0, which has the coordinator, asks"
        since = self._partial_since
        if since is not None and (coord.pending() or time.monotonic() - since >= self._tick):
            return True
        return coord.stall_check_due()

    def _agreed(self) -> bool:
        """Run what the round just completed agreed: the cached ops every rank has (in id order),
        then, if any rank asked for one, a negotiation phase."""
        and_v, or_v = rounds.decode(self._round_recv, self._round_words)
        ready = and_v >> rounds.FLAG_BITS
        if self._coord is not None:
            partial = (or_v >> rounds.FLAG_BITS) & ~ready
            if not partial:
                self._partial_since = None
            elif self._partial_since is None:
                self._partial_since = time.monotonic()
        if ready:
            meter = self._meter
            if meter.on:  # ops whose bit this rank first sent in this very round: it came last (or tied)
                meter.collectives += ready.bit_count()
                meter.last += (ready & self._sent & ~self._sent_prev).bit_count()
                self._sent &= ~ready  # (a resubmission of the same op next round is a new one)
            self._run_cached(ready)
        if or_v & rounds.FLAG_MASK:
            self._phase()
            return True
        return bool(ready)

    def _run_cached(self, ready: int) -> None:
        """Run the cached ops of `ready` (every rank has them): in id order, fused as the cache's
        plan says (fusion.Fuser on their metas alone, so the same on every rank)."""
        self._mask &= ~ready
        bycid = self._bycid
        reduce, finish = self._dispatch.reduce, self._completion.finish_reduced
        if not ready & (ready - 1):  # one op
            req = bycid.pop(ready.bit_length() - 1)
            if self._timeline is not None:
                self._negotiated([req])
            finish([req], reduce([req.name], [req]))
            return
        for batch in self._cache.plan(ready, self._threshold):
            reqs = [bycid.pop(c) for c in batch]
            self._negotiated(reqs)
            finish(reqs, reduce([r.name for r in reqs], reqs))

    def _negotiated(self, reqs: Sequence[Request | None]) -> None:
        if self._timeline is not None:
            now = self._timeline.now()
            for r in reqs:
                if r is not None:
                    self._timeline.span([r.name], "NEGOTIATE", r.submitted, now)

    def _phase(self) -> None:
        """Every rank announces all it has not announced yet (cached ops as their ids); rank 0's
        coordinator answers; every rank runs the answer. Two blocking collectives: every rank is here."""
        items: list[Meta | int] = [r.meta() for r in self._fresh]
        items += self._bycid  # (cached ops as their ids)
        announced = self._announced
        for r in self._fresh:
            announced[r.name] = r
        for r in self._bycid.values():
            announced[r.name] = r
        self._fresh, self._bycid, self._mask = [], {}, 0
        self._sent = 0  # (straggler counts: these ops now wait for a response, in no round's bits)
        reason = self._queue.abort_reason
        if reason is not None and not self._abort_sent:
            items.append(Request("abort", reason).meta())
            self._abort_sent = True
        gathered = self._ctrl.gather(items, root=0)
        responses = None
        if self._coord is not None:
            by_id = self._cache.metas
            for src, metas in enumerate(gathered):
                if metas:
                    self._coord.submit(src, [by_id[m] if m.__class__ is int else m for m in metas])
            responses = self._coord.responses()
        responses = self._ctrl.bcast(responses, root=0)
        if responses:
            self._execute(responses)

    def _error(self, error, names: list) -> HorovodInternalError:
        """The exception a failed response raises on this rank."""
        if error.kind == "stall":
            return StallError(error.message, absent=error.absent, names=tuple(names), seconds=error.seconds)
        return _ERRORS[error.kind](error.message)

    def _execute(self, responses: list[Response]) -> None:
        """Run a phase's responses (negotiation.py), in order."""
        announced, dispatch, completion = self._announced, self._dispatch, self._completion
        for kind, names, info, error in responses:
            if kind == "abort":
                assert error is not None, "an abort response carries its reason"
                self._queue.close()
                self.fail_all(HorovodInternalError(
                    f"trainrun: {error.message}; collectives cannot complete (trainrun is shut down on this rank)"))
                return
            if error is not None:  # info: the ranks that submitted each name
                failed = [announced.pop(n) for n, ranks in zip(names, info) if self.rank in ranks]
                if failed:  # (made only where raised: making a StallError tells the launcher, rankhook.py)
                    completion.finish(failed, [None] * len(failed), self._error(error, names))
                continue
            reqs = [announced.pop(n, None) for n in names]
            self._negotiated(reqs)
            if kind == "allreduce":
                req = reqs[0]
                if info is None:  # no join in effect: every rank has every request (none is None)
                    every = cast("list[Request]", reqs)
                    self._cache.add(every)
                    completion.finish_reduced(every, dispatch.reduce(names, every))
                    continue
                if (req is not None and req.splits == GROUP) or len(info.shapes) != len(names):
                    # a group: one fused reduction (zeros for all its tensors on a rank that has joined)
                    results = [dispatch.allreduce_group(req, names, info)]
                else:
                    results = dispatch.execute(kind, names, reqs, info)
            else:
                results = dispatch.execute(kind, names, reqs, info)
                if kind == "join":
                    self._joining = False
                elif kind == "shutdown":
                    self.shutdown_ok = True
                    self._queue.close()
            done = [(r, res) for r, res in zip(reqs, results) if r is not None]
            completion.finish([r for r, _ in done], [res for _, res in done], None)

    # ---- failure ------------------------------------------------------------------------------
    def broken(self, e: Exception) -> None:
        """An MPI or internal failure while driving: nothing can be trusted to complete any more. The
        requests being executed when it happened are in no stage any more: their waiters get the same
        error (Completion.orphaned, from waiter.py)."""
        error = self._completion.broken(e)
        self._queue.close()
        self.fail_all(error)

    def fail_all(self, error: BaseException) -> None:
        """Fail every request this rank has outstanding, at whatever stage, with `error` (also after
        the background thread has stopped)."""
        left = self._queue.take()
        left += self._fresh + list(self._bycid.values()) + list(self._announced.values())
        self._fresh, self._bycid, self._mask = [], {}, 0
        self._announced.clear()
        self._completion.finish(left, [None] * len(left), error)

    # ---- the lone-op path's hand-offs (lone.py; caller holds `lock`) ------------------------------
    def quiet(self) -> bool:
        """Nothing in the driver's hands: a lone op may post a round of its own."""
        return self._inflight is None and not (self._queue.closed or self._fresh or self._bycid or self._announced) \
            and self._queue.abort_reason is None and (self._coord is None or not self._wants_phase())

    def solo_round(self, cid: int, spin) -> bool:
        """Post a round with op `cid` alone and no flags, and poll it as a blocking MPI call would, while
        `spin(age)` holds (the general loop backs off after that). Caller holds `lock`, quiet(). True
        when every rank sent the same (the op runs now: the caller runs it); else the round is either
        completed (`adopt` runs what it agreed) or still in flight (for the general loop)."""
        send = self._cache.solo(cid)
        request = self._start_round(send)
        polls, start = 0, None
        while not request.Test():
            polls += 1
            if not polls & 63:
                now = time.monotonic()
                start = start or now
                if not spin(now - start):
                    return False
        self._inflight = None
        self.rounds += 1
        if self._round_recv == send:  # AND == OR == this op alone reduces to what every rank sent
            self._partial_since = None
            return True
        return False

    def adopt(self, req: Request, cid: int, waited: bool) -> None:
        """Take the lone op `req` (cached as `cid`; its name already outstanding: RequestQueue.adopt)
        after a solo round that did not run it: an ordinary cached request from here on. `waited`: it
        waited for a peer (straggler counts: not last). Runs what the round agreed if it completed."""
        if waited:
            self._sent = self._sent_prev = 1 << cid
        req.cid = cid
        self._bycid[cid] = req
        self._mask |= 1 << cid
        if self._inflight is None:
            self._agreed()

    # ---- read by other threads, best effort (the stuck watchdog) ---------------------------------
    def kinds(self) -> dict[str, str]:
        """Name -> kind of the requests in the driver's stages (read without the lock)."""
        kinds: dict[str, str] = {}
        for source in (self._announced.values, self._bycid.values, lambda: self._fresh):
            try:
                for r in list(source()):
                    kinds.setdefault(r.name, r.kind)
            except RuntimeError:  # changed size while copied: the names found still say enough
                pass
        return kinds

    def close(self) -> None:
        """Free the round port (no round in flight: after shutdown's response)."""
        self._port.close()
