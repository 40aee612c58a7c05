"""The engine: matches named operations across ranks, runs them in one agreed order, completes handles.

Threads and ownership:
- Any thread may `submit` Requests (gradient hooks do, in any order). Submission only queues.
- Progress happens in whichever thread holds `_drive`: the background thread, or a caller blocked
  in `wait` -- that caller drives progress itself, so a blocking op costs no thread hand-off (the
  background thread stands aside while someone waits).

Agreement (Horovod's response cache, without its fixed cycle): ranks run *rounds* in lockstep, one
after another, each a single small MPI_Iallreduce (rounds.py). In a round every rank contributes a
bitmask of its ready ops whose signature (Request.meta) ran before -- each such signature has a
response-cache id, the same on every rank -- plus flags; the AND says which ops every rank has
(they run at once, in id order, small ones fused), the OR whether anyone needs a *negotiation
phase*: ops the cache does not know (first use, changed shape/dtype/op, other kinds), join, abort,
or rank 0's wish to match leftovers or check stalls. A phase gathers every rank's not yet announced
ops to rank 0, whose Coordinator (negotiation.py) answers with responses -- ready ops, fused;
mismatch and stall errors naming tensors and ranks -- broadcast to all and run in that order. Ops
announced once stay with the coordinator until a response names them. Allreduce signatures that ran
get the next cache ids (cache.py), everywhere alike, since every rank runs the same rounds in order.
So a repeated op costs one round (~2 us of MPI) before its data moves; ranks may issue ops in any
order; a rank that issues a name with another shape/dtype/op sends a new signature, negotiated and
checked in full, so mismatches and stalls are reported as on first use.
- A rank posts rounds while it has anything outstanding; with nothing to do, and no round for
  IDLE_S, its background thread still takes part in one, so that phases (stall errors, abort)
  reach every rank and rank 0 can say which rank did not submit what. Ops ready on some ranks
  only for longer than a tick are pulled into a phase, where the coordinator's stall clock runs.
- Shortcuts for the latency of a lone blocking op (nothing else outstanding on this rank, cached
  signature): `run` -> `_alone` does the general steps inline; `allreduce_now` (in-place or
  out-of-place CPU allreduce) skips even the Request. Both fall back to the general loop when the
  round shows the others have more to agree on, or a peer is late.
- Idle policy: a caller blocked in wait() keeps the driver lock and polls without yielding while it
  makes progress or for WAITER_SPIN_S after the last progress, then sleeps with growing delays up to
  MAX_SLEEP_S, letting other threads drive in between; the background thread yields the CPU after
  BACKGROUND_SPIN_S.

Failure: a mismatch or stall response fails the named handles on every rank that submitted them; an
exception inside the engine fails every outstanding handle and closes the engine. `shutdown()` is
collective (it waits for every rank's shutdown, or the stall timeout), fails whatever is left, writes the
timeline and frees the communicators. `abort()` (a rank exiting after an unhandled exception) is not:
it flags its next round, and the phase that follows makes every other rank fail everything outstanding.
"""
from __future__ import annotations

import os
import sys
import threading
import time

from mpi4py import MPI

from trainrun.runtime import rounds
from trainrun.runtime import timeline as tl
from trainrun.runtime.backends.mpi import MPIBackend
from trainrun.runtime.cache import ResponseCache
from trainrun.runtime.collectives import Collectives
from trainrun.runtime.exceptions import HorovodInternalError, StallError, TensorMismatchError
from trainrun.runtime.fusion import _WIRE
from trainrun.runtime.negotiation import SHUTDOWN_NAME, Coordinator
from trainrun.runtime.ops import GROUP, Handle, Request

# A caller blocked in wait() has nothing better to do than poll; the background thread shares the
# core with the training loop (gradient hooks fire during backward), so it yields the CPU sooner.
WAITER_SPIN_S, BACKGROUND_SPIN_S, MAX_SLEEP_S = 0.002, 0.0001, 0.0002
IDLE_S = 0.005          # an idle rank takes part in a round at least this often (see above)
_ERRORS = {"mismatch": TensorMismatchError, "stall": StallError, "abort": HorovodInternalError}


class _Backoff:
    """How long a poller with nothing to do should wait: 0 (just yield) for `spin_s` after the last
    progress, then growing sleeps up to MAX_SLEEP_S."""

    def __init__(self, spin_s: float):
        self._spin = spin_s
        self.reset()

    def reset(self) -> None:
        self._since = time.monotonic()

    def delay(self) -> float:
        idle = time.monotonic() - self._since
        return 0.0 if idle < self._spin else min(MAX_SLEEP_S, idle / 16)


class Engine:
    def __init__(self, comm, rank: int, size: int, *, fusion_threshold: int, stall_timeout: float,
                 timeline_path: str | None = None, set_id: int = 0, ranks: list[int] | None = None):
        """Collective over `comm` (duplicates it twice). Starts the background thread. `set_id` and
        `ranks` (global ranks of comm's members) name the process set it serves (process_sets.py)."""
        self.rank, self.size = rank, size
        self.set_id, self.ranks = set_id, list(range(size)) if ranks is None else ranks
        self._ctrl = comm.Dup()
        self._backend = MPIBackend(comm, wait=self._complete)
        self._timeline_path = timeline_path
        self._timeline = tl.Timeline(rank, self._ctrl.bcast(time.time(), root=0)) if timeline_path else None
        self._coll = Collectives(self._backend, rank, size, self._timeline)
        # ranks fuse cached ops themselves: they must agree on the threshold, so rank 0's counts
        self._threshold = self._ctrl.bcast(fusion_threshold, root=0)
        self._coord = Coordinator(size, self._threshold, stall_timeout) if rank == 0 else None
        self._tick = min(1.0, stall_timeout / 4)

        self._lock = threading.RLock()          # _cv's lock, taken directly on hot paths (C-level enter/exit)
        self._cv = threading.Condition(self._lock)
        self._queue: list[Request] = []      # submitted, not yet seen by the driver   (under _cv)
        self._names: set[str] = set()        # names outstanding on this rank            (under _cv)
        self._drivers = 0                    # callers in (or promised to enter) wait()  (under _cv)
        self._promised = 0                   # submit(caller_waits=True) not yet waiting (under _cv)
        self._closed = False                 # no more submits; driver stops             (under _cv)
        self._idle = False                   # the background thread waits on _cv        (under _cv)
        self._abort_reason: str | None = None  # set by abort()                          (under _cv)

        self._drive = threading.Lock()
        self._done_cv = threading.Condition()    # waiters that sleep between polls; notified on completion
        self._sleepers = 0                       # (under _done_cv)
        # driver-only state: requests by stage, the round in flight, the response cache
        self._fresh: list[Request] = []          # not announced, signature not cached
        self._bycid: dict[int, Request] = {}     # not announced, cached: in every round's mask
        self._mask = 0                           # bits of _bycid's ids
        self._announced: dict[str, Request] = {}  # sent to the coordinator, waiting for a response
        self._joining = False                    # this rank's join() is outstanding
        self._abort_sent = False
        self._inflight = None                    # (MPI request, send bytes, recv buffer, words) of the round
        self._rounds = 0                         # rounds completed (the background thread's sign of activity)
        self._cache = ResponseCache()
        self._partial_since: float | None = None  # rank 0: since when some cached op is ready on some ranks only
        self._shutdown_ok = False

        self._thread = threading.Thread(target=self._run, name="trainrun-engine", daemon=True)
        self._thread.start()

    # ---- called by user threads -------------------------------------------------------------
    def submit(self, reqs: list[Request], *, caller_waits: bool = False) -> None:
        """Queue requests (announced together). Raises ValueError for a name already in flight here.

        `caller_waits=True` promises an immediate `wait`/`wait_all` on them: the background thread is
        not woken, so the caller's own wait drives them without a thread hand-off.
        """
        with self._lock:
            if self._closed:
                raise HorovodInternalError("trainrun has been shut down; call init() again to use collectives")
            if len(reqs) == 1 and not caller_waits and self._timeline is None:  # the async op's path
                name = reqs[0].name
                if name not in self._names:
                    self._names.add(name)
                    self._queue.append(reqs[0])
                    if self._idle:
                        self._idle = False  # one wake-up per burst of submits: the thread takes the whole queue
                        self._cv.notify_all()
                    return
            names = [r.name for r in reqs]
            dup = self._names.intersection(names) or (len(set(names)) < len(names) and names)
            if dup:
                raise ValueError(f"Requested a collective on tensor name(s) {sorted(set(dup))} while an "
                                 "operation with the same name is still in flight on this rank; names must be unique")
            if self._timeline is not None:
                now = self._timeline.now()
                for r in reqs:
                    r.submitted = now
            self._names.update(names)
            self._queue.extend(reqs)
            if caller_waits:
                self._drivers += 1
                self._promised += 1
            elif self._idle:
                self._idle = False  # one wake-up per burst of submits: the thread takes the whole queue
                self._cv.notify_all()

    def run(self, reqs: list[Request]) -> list:
        """`submit(reqs, caller_waits=True)` then `wait_all` of their handles, in fewer steps for one
        request: the path of every blocking call (api.run). Returns the results or raises the first error."""
        if len(reqs) != 1:
            self.submit(reqs, caller_waits=True)
            return self.wait_all([r.handle for r in reqs])
        req = reqs[0]
        with self._lock:
            if self._closed:
                raise HorovodInternalError("trainrun has been shut down; call init() again to use collectives")
            if req.name in self._names:
                raise ValueError(f"Requested a collective on tensor name(s) {[req.name]} while an operation "
                                 "with the same name is still in flight on this rank; names must be unique")
            if self._timeline is not None:
                req.submitted = self._timeline.now()
            self._names.add(req.name)
            self._drivers += 1
            alone = len(self._names) == 1 and not self._queue and self._timeline is None
            if not alone:
                self._queue.append(req)
        if alone and not self._alone(req):
            with self._lock:
                self._queue.append(req)
        self._wait_run(req)
        return [req.handle.result]

    def allreduce_now(self, send, recv, shape: tuple, dtype: str, name: str, op: int, postscale: float) -> bool:
        """`recv` = op over ranks of `send` (None: in place), blocking: the lone allreduce's shortcut.

        Applies to a CPU array whose storage is its wire dtype (not float16/bfloat16), without
        prescale, whose signature is cached, while nothing else is outstanding on this rank: then it
        costs one round and one MPI call, and no Request (this is the latency of a lone small
        allreduce, and of a large one's start on a cold cache). Returns False, having done nothing,
        where it does not apply (the caller takes the general path); raises like run()."""
        cid = self._cache.ids.get((name, "allreduce", dtype, shape, op, 1.0, postscale, -1, None, "cpu"))
        if cid is None or dtype in _WIRE or self._names or self._queue or self._timeline is not None \
                or not self._drive.acquire(blocking=False):
            return False
        req = None
        try:
            if not self._quiet():
                return False
            inflight = self._solo_round(cid)
            if inflight is None:  # every rank has this op and nothing else: run it
                self._coll.allreduce_arrays(send, recv, op, postscale, MPI.Request.Wait)
                return True
            # the others had more to agree on: from here on an ordinary request
            req = Request("allreduce", name, recv if send is None else send, recv, shape, dtype, op, 1.0, postscale)
            req.cid = cid
            with self._lock:
                self._names.add(name)
                self._drivers += 1
            self._bycid[cid] = req
            self._mask |= 1 << cid
            if self._inflight is None:
                self._agreed(inflight)
        except Exception as e:  # as in _progress
            self._broken(e)
            if req is None:
                raise HorovodInternalError(f"trainrun engine failed: {type(e).__name__}: {e}") from e
        finally:
            self._drive.release()
        self._wait_run(req)
        return True

    def _alone(self, req: Request) -> bool:
        """run() of one request with nothing else outstanding on this rank, cached signature: the
        general steps (intake, post, test, agree, reduce, finish) inline. Returns False, having done
        nothing, when it does not apply; True once `req` is the driver's (done, or left in its round
        for the general loop)."""
        if not self._drive.acquire(blocking=False):
            return False
        try:
            cid = self._cache.ids.get(req.meta())
            if cid is None or not self._quiet():
                return False
            req.cid = cid
            self._bycid[cid], self._mask = req, 1 << cid
            inflight = self._solo_round(cid)
            if inflight is None:  # every rank has this op and nothing else: run it
                del self._bycid[cid]
                self._mask = 0
                handle = req.handle  # finished here; run() removes its name from _names
                handle.result = self._coll.allreduce_one(req) if req.device == "cpu" and req.splits is None \
                    else self._reduce([req.name], [req])[0]
                handle.done = True
            elif self._inflight is None:
                self._agreed(inflight)
            return True
        except Exception as e:  # as in _progress
            self._broken(e)
            return True
        finally:
            self._drive.release()

    def _quiet(self) -> bool:
        """Nothing in the driver's hands (caller holds _drive): a lone op may take a shortcut."""
        return self._inflight is None and not (self._closed or self._fresh or self._bycid or self._announced) \
            and self._abort_reason is None and (self._coord is None or not self._wants_phase())

    def _solo_round(self, cid: int):
        """Post a round with op `cid` alone and no flags, and spin for it as a blocking MPI call would,
        up to WAITER_SPIN_S (the general loop backs off after that). Caller holds _drive, _quiet().
        Returns None when every rank sent the same (the op runs now), else the round: completed
        (the caller runs `_agreed` on it) or still in flight (left as self._inflight)."""
        n = self._cache.words
        send = self._cache.solo(cid)
        recv = bytearray(16 * n)
        request = self._ctrl.Iallreduce([send, MPI.UINT64_T], [recv, MPI.UINT64_T], op=MPI.BAND)
        inflight = self._inflight = (request, send, recv, n)
        polls, deadline = 0, None
        while not request.Test():
            polls += 1
            if not polls & 63:
                now = time.monotonic()
                deadline = deadline or now + WAITER_SPIN_S
                if now > deadline:
                    return inflight
        self._inflight = None
        self._rounds += 1
        if recv == send:  # AND == OR == this op alone reduces to what every rank sent
            self._partial_since = None
            return None
        return inflight

    def _wait_run(self, req: Request) -> None:
        """The rest of run() for `req`, already counted in _names and _drivers: drive until done."""
        handle = req.handle
        try:
            if not handle.done:
                self._drive_until(handle)
        finally:
            with self._lock:  # _cv's lock: notify_all below is allowed
                if handle.done:  # (a failure discarded it already)
                    self._names.discard(req.name)
                self._drivers -= 1
                if not self._drivers and (self._queue or self._names):
                    self._cv.notify_all()
        if handle.error is not None:
            raise handle.error

    def wait(self, handle: Handle):
        """Block until `handle` completes, driving progress meanwhile; return its result or raise its error."""
        return self.wait_all([handle])[0]

    def wait_all(self, handles: list[Handle]) -> list:
        """Block until every handle completes (driving progress); their results, or the first error."""
        with self._cv:
            if self._promised:
                self._promised -= 1
            else:
                self._drivers += 1
        try:
            for handle in handles:
                self._drive_until(handle)
        finally:
            with self._cv:
                self._drivers -= 1
                self._hand_back()
        for handle in handles:
            if handle.error is not None:
                raise handle.error
        return [h.result for h in handles]

    def _hand_back(self) -> None:
        """Wake the background thread if the last driver left work behind. Caller holds _cv."""
        if not self._drivers and (self._queue or self._names):
            self._cv.notify_all()

    def _drive_until(self, handle: Handle) -> None:
        """Drive progress until `handle` is done. The driver lock is held across polls while they make
        progress or are young (WAITER_SPIN_S): a blocked caller spins like a blocking MPI call would,
        with no yield or lock hand-off per poll (each costs microseconds, a yield on a loaded machine
        far more); after that it polls with growing sleeps and lets other threads drive in between."""
        backoff = None
        while not handle.done:
            if not self._drive.acquire(blocking=False):
                self._sleep(MAX_SLEEP_S, handle)   # another thread is driving
                continue
            try:
                deadline = time.monotonic() + WAITER_SPIN_S
                while not handle.done:
                    if self._progress():
                        deadline = time.monotonic() + WAITER_SPIN_S
                        backoff = None
                    elif time.monotonic() > deadline:
                        break
            finally:
                self._drive.release()
            if not handle.done:
                backoff = backoff or _Backoff(0.0)
                delay = backoff.delay()
                self._sleep(delay, handle) if delay else os.sched_yield()

    def _sleep(self, seconds: float, handle: Handle) -> None:
        with self._done_cv:
            if not handle.done:
                self._sleepers += 1
                self._done_cv.wait(seconds)
                self._sleepers -= 1

    def shutdown(self) -> None:
        """Collective shutdown; idempotent. Fails what is still outstanding with HorovodInternalError."""
        if self._thread is None:
            return
        req = Request("shutdown", SHUTDOWN_NAME)
        try:
            self.submit([req])
            self.wait(req.handle)
        except HorovodInternalError:
            pass
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join()
        self._thread = None
        self._fail_all(HorovodInternalError("trainrun shut down before this operation completed"))
        if self._shutdown_ok:  # every rank is here, no round in flight: safe to use collectives and free
            if self._timeline is not None:
                events = self._ctrl.gather(self._timeline.events, root=0)
                if self.rank == 0:
                    tl.write(self._timeline_path, events)
            self._coll.close()
            self._backend.close()
            self._ctrl.Free()

    def abort(self, reason: str, grace_s: float = 1.0) -> None:
        """Stop this rank without waiting for the others' collectives (it is exiting after an
        unhandled exception). Its next round carries the ABORT flag; in the phase that follows the
        coordinator makes every rank fail what it has outstanding at once, instead of stalling.
        Not collective. If the others do not take part within ~3 x `grace_s` (hung), the process
        exits at once (status 1): MPI_Finalize could otherwise wait forever on the round in flight."""
        if self._thread is None:
            return
        with self._cv:
            self._abort_reason = reason
            self._cv.notify_all()
        self._thread.join(3 * grace_s)
        if self._thread.is_alive():
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(1)
        self._thread = None
        self._fail_all(HorovodInternalError(f"trainrun stopped on this rank: {reason}"))

    @property
    def reductions(self) -> int:
        """How many allreduce calls reached the backend so far (fusion makes this < tensors reduced)."""
        return self._coll.reductions

    # ---- the driver -------------------------------------------------------------------------
    def _has_work(self) -> bool:
        """Something outstanding on this rank (caller holds _cv)."""
        return bool(self._queue or self._names or self._inflight is not None) or self._abort_reason is not None

    def _run(self) -> None:
        backoff = _Backoff(BACKGROUND_SPIN_S)
        seen = -1
        while True:
            idle_round = False
            with self._cv:
                while not self._closed and (self._drivers or not self._has_work()):
                    self._idle = True
                    woken = self._cv.wait(IDLE_S if self.size > 1 else None)
                    self._idle = False
                    if not woken and not self._drivers and not self._has_work():
                        if self._rounds != seen:  # rounds ran meanwhile (ops): every rank takes part already
                            seen = self._rounds
                            continue
                        idle_round = True  # take part in a round: others may need this rank's answer
                        seen = self._rounds + 1  # (that round itself is no sign of activity)
                        break
                if self._closed:
                    return
            if not self._drive.acquire(blocking=False):
                continue
            try:
                progressed = self._progress(idle_round)
            finally:
                self._drive.release()
            if progressed:
                backoff.reset()
                continue
            delay = backoff.delay()
            if delay:
                with self._cv:
                    self._idle = True
                    self._cv.wait(delay)
                    self._idle = False
            else:
                os.sched_yield()

    def _complete(self, request) -> None:
        """Wait for an MPI request of a running collective: spinning while a caller waits on the
        engine, else (the background thread, overlapping the training loop) yielding the CPU between
        polls, so a late peer does not cost this rank's compute a core."""
        while not self._drivers:
            if request.Test():
                return
            os.sched_yield()
        request.Wait()  # someone is blocked on the engine: nothing else to run here

    def _progress(self, idle: bool = False) -> bool:
        """One step: take in new requests, post or test the round, run what it agreed. Caller holds _drive."""
        try:
            return self._step(idle)
        except Exception as e:
            self._broken(e)
            return True

    def _broken(self, e: Exception) -> None:
        """An MPI or internal failure while driving: nothing can be trusted to complete any more."""
        with self._cv:
            self._closed = True
        self._fail_all(HorovodInternalError(f"trainrun engine failed: {type(e).__name__}: {e}"))

    def _step(self, idle: bool) -> bool:
        """The hot path of every operation: kept free of allocations and lock round-trips when there
        is nothing to do. Returns whether anything moved (a round that agreed nothing does not count)."""
        if self._closed:
            return False
        progressed = False
        if self._queue:
            self._intake()
            progressed = True
        inflight = self._inflight
        if inflight is None:
            if not (self._bycid or self._fresh or self._announced or idle) and self._abort_reason is None:
                return progressed
            inflight = self._post()
        if not inflight[0].Test():
            return progressed
        self._inflight = None
        self._rounds += 1
        return self._agreed(inflight) or progressed

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
        n = self._cache.words
        send = rounds.encode(flags, self._mask, n)
        recv = bytearray(16 * n)
        req = self._ctrl.Iallreduce([send, MPI.UINT64_T], [recv, MPI.UINT64_T], op=MPI.BAND)
        self._inflight = inflight = (req, send, recv, n)
        return inflight

    def _wants_phase(self) -> bool:
        """Rank 0: a phase is due to match cached ops the coordinator holds elsewhere, to pull ops
        that are ready on some ranks only for a tick (their stall clock starts there), or to check stalls."""
        coord = self._coord
        since = self._partial_since
        if since is not None and (coord.pending() or time.monotonic() - since >= self._tick):
            return True
        return coord.stall_check_due()

    def _agreed(self, inflight) -> bool:
        """Run what a completed round agreed: the cached ops every rank has (in id order), then, if
        any rank asked for one, a negotiation phase."""
        and_v, or_v = rounds.decode(inflight[2], inflight[3])
        ready = and_v >> rounds.FLAG_BITS
        if self._coord is not None:
            partial = (or_v >> rounds.FLAG_BITS) & ~ready
            if not partial:
                self._partial_since = None
            elif self._partial_since is None:
                self._partial_since = time.monotonic()
        if ready:
            self._run_cached(ready)
        if or_v & rounds.FLAG_MASK:
            self._phase()
            return True
        return bool(ready)

    def _run_cached(self, ready: int) -> None:
        """Run the cached ops of `ready` (every rank has them): in id order, small ones fused by
        dtype/op/scales/device up to the fusion threshold -- decided from their metas alone, so the
        same on every rank."""
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
        if req.splits == GROUP:
            return [self._coll.allreduce_group(req, names, None)]
        if req.device == "cpu":
            if len(reqs) == 1 and self._timeline is None:
                return [self._coll.allreduce_one(req)]
            return self._coll.allreduce(names, reqs, None)
        return self._coll.execute("allreduce", names, reqs, None)

    def _negotiated(self, reqs: list[Request]) -> None:
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

    def _execute(self, responses: list[tuple]) -> None:
        """Run a phase's responses (negotiation.py), in order."""
        announced = self._announced
        for kind, names, info, error in responses:
            if kind == "abort":
                with self._cv:
                    self._closed = True
                self._fail_all(HorovodInternalError(
                    f"trainrun: {error[1]}; collectives cannot complete (trainrun is shut down on this rank)"))
                return
            if error is not None:
                failed = [announced.pop(n) for n, ranks in zip(names, info) if self.rank in ranks]
                self._finish(failed, [None] * len(failed), _ERRORS[error[0]](error[1]))
                continue
            reqs = [announced.pop(n, None) for n in names]
            self._negotiated(reqs)
            if kind == "allreduce":
                req = reqs[0]
                if info is None:  # no join in effect: every rank has every request
                    self._cache.add(reqs)
                    self._finish_reduced(reqs, self._reduce(names, reqs))
                    continue
                if (req is not None and req.splits == GROUP) or len(info[5]) != len(names):
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

    def _finish_reduced(self, reqs: list[Request], results: list) -> None:
        if len(reqs) == 1:  # the common case, in as few steps as possible
            req = reqs[0]
            handle = req.handle
            handle.result = results[0]
            handle.done = True
            with self._lock:
                self._names.discard(req.name)
            if self._sleepers:
                with self._done_cv:
                    self._done_cv.notify_all()
            return
        self._finish(reqs, results, None)

    def _finish(self, reqs: list[Request], results: list, error: BaseException | None) -> None:
        for r, res in zip(reqs, results):
            h = r.handle
            h.result, h.error = res, error
            h.done = True
        with self._lock:
            self._names.difference_update(r.name for r in reqs)
        if self._sleepers:
            with self._done_cv:
                self._done_cv.notify_all()

    def _fail_all(self, error: BaseException) -> None:
        with self._cv:
            left, self._queue = self._queue, []
        left += self._fresh + list(self._bycid.values()) + list(self._announced.values())
        self._fresh, self._bycid, self._mask = [], {}, 0
        self._announced.clear()
        self._finish(left, [None] * len(left), error)
