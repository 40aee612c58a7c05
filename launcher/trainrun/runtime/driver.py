"""The engine's agreement loop (engine.py explains rounds and phases): one `_progress` step takes in
queued requests, posts or tests this rank's round, and runs what a completed round agreed -- cached
ops every rank has, then, if any rank asked, a negotiation phase with the coordinator.

A mixin of Engine: its methods run only in the thread holding `Engine._drive`, and use the state
Engine.__init__ documents (driver-only state freely; the shared queue and flags under `_lock`).
"""
from __future__ import annotations

import time

from trainrun.runtime import rounds
from trainrun.runtime.exceptions import HorovodInternalError, StallError, TensorMismatchError
from trainrun.runtime.messages import Response
from trainrun.runtime.ops import GROUP, Request

_ERRORS = {"mismatch": TensorMismatchError, "stall": StallError, "abort": HorovodInternalError,
           "left": HorovodInternalError}


class Driver:
    def _progress(self, idle: bool = False) -> bool:
        """One step: take in new requests, post or test the round, run what it agreed. Caller holds _drive."""
        try:
            return self._step(idle)
        except Exception as e:
            self._broken(e)
            return True

    def _step(self, idle: bool) -> bool:
        """The hot path of every operation: kept free of allocations and lock round-trips when there
        is nothing to do. Returns whether anything moved (a round that agreed nothing does not count)."""
        if self._closed:
            return False
        progressed = False
        if self._queue:
            self._intake()
            progressed = True
        request = self._inflight
        if request is None:
            if not (self._bycid or self._fresh or self._announced or idle) and self._abort_reason is None:
                return progressed
            request = self._post()
        if not request.Test():
            return progressed
        self._inflight = None
        self._rounds += 1
        return self._agreed() or progressed

    def _intake(self) -> None:
        with self._lock:
            new, self._queue = self._queue, []
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
        if self._abort_reason is not None and not self._abort_sent:
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
            if self.measure:  # ops whose bit this rank first sent in this very round: it came last (or tied)
                self.collectives += ready.bit_count()
                self.last += (ready & self._sent & ~self._sent_prev).bit_count()
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
        if not ready & (ready - 1):  # one op
            req = bycid.pop(ready.bit_length() - 1)
            self._negotiated([req])
            self._finish_reduced([req], self._reduce([req.name], [req]))
            return
        for batch in self._cache.plan(ready, self._threshold):
            reqs = [bycid.pop(c) for c in batch]
            self._negotiated(reqs)
            self._finish_reduced(reqs, self._reduce([r.name for r in reqs], reqs))

    def _reduce(self, names: list[str], reqs: list[Request]) -> list:
        """One allreduce of `reqs` (every rank has them, no join in effect): results, one per request."""
        req = reqs[0]
        if self.measure:  # (diag/perf.py) the payload, for the monitor's allreduce throughput
            self.reduced_bytes += sum(sum(a.nbytes for a in r.inp) if r.splits == GROUP else r.inp.nbytes
                                      for r in reqs)
        if req.splits == GROUP:
            return [self._coll.allreduce_group(req, names, None)]
        if req.device == "cpu":
            if len(reqs) == 1 and self._timeline is None:
                return [self._coll.allreduce_one(req)]
            return self._coll.allreduce(names, reqs, None)
        return self._coll.execute("allreduce", names, reqs, None)

    def _negotiated(self, reqs: list[Request | None]) -> None:
        if self._timeline is not None:
            now = self._timeline.now()
            for r in reqs:
                if r is not None:
                    self._timeline.span([r.name], "NEGOTIATE", r.submitted, now)

    def _phase(self) -> None:
        """Every rank announces all it has not announced yet (cached ops as their ids); rank 0's
        coordinator answers; every rank runs the answer. Two blocking collectives: every rank is here."""
        items = [r.meta() for r in self._fresh]
        items += self._bycid
        announced = self._announced
        for r in self._fresh:
            announced[r.name] = r
        for r in self._bycid.values():
            announced[r.name] = r
        self._fresh, self._bycid, self._mask = [], {}, 0
        self._sent = 0  # (straggler counts: these ops now wait for a response, in no round's bits)
        if self._abort_reason is not None and not self._abort_sent:
            items.append(Request("abort", self._abort_reason).meta())
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

    def _execute(self, responses: list[Response]) -> None:
        """Run a phase's responses (negotiation.py), in order."""
        announced = self._announced
        for kind, names, info, error in responses:
            if kind == "abort":
                with self._cv:
                    self._closed = True
                self._fail_all(HorovodInternalError(
                    f"trainrun: {error.message}; collectives cannot complete (trainrun is shut down on this rank)"))
                return
            if error is not None:  # info: the ranks that submitted each name
                failed = [announced.pop(n) for n, ranks in zip(names, info) if self.rank in ranks]
                self._finish(failed, [None] * len(failed), _ERRORS[error.kind](error.message))
                continue
            reqs = [announced.pop(n, None) for n in names]
            self._negotiated(reqs)
            if kind == "allreduce":
                req = reqs[0]
                if info is None:  # no join in effect: every rank has every request
                    self._cache.add(reqs)
                    self._finish_reduced(reqs, self._reduce(names, reqs))
                    continue
                if (req is not None and req.splits == GROUP) or len(info.shapes) != len(names):
                    # a group: one fused reduction (zeros for all its tensors on a rank that has joined)
                    results = [self._coll.allreduce_group(req, names, info)]
                else:
                    results = self._coll.execute(kind, names, reqs, info)
            else:
                results = self._coll.execute(kind, names, reqs, info)
                if kind == "join":
                    self._joining = False
                elif kind == "shutdown":
                    self._shutdown_ok = True
                    with self._cv:
                        self._closed = True
            done = [(r, res) for r, res in zip(reqs, results) if r is not None]
            self._finish([r for r, _ in done], [res for _, res in done], None)
