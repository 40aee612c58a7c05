"""The engine: matches named operations across ranks, runs them in one agreed order, completes handles.

Threads and ownership:
- Any thread may `submit` Requests (gradient hooks do, in any order). Submission only queues.
- Progress (announce, negotiate, run the MPI calls) happens in whichever thread holds `_drive`: the
  background thread, or a caller blocked in `wait` -- that caller drives progress itself, so a lone
  blocking op costs no thread hand-off (the background thread stands aside while someone waits).
- Rank 0 also runs the Coordinator (negotiation.py). Every rank sends the metas of its new requests to
  rank 0 as soon as it sees them; rank 0 answers with responses the moment a name is ready on every
  rank (no fixed cycle), and every rank, rank 0 included, runs the responses in the order received.
  Control messages use a private communicator with nonblocking sends, data a second one (backend).
  Announcements are `[rank, item...]`; responses lists of response tuples (negotiation.py).
- Response cache (as Horovod's): a lone allreduce that ran (one name, no join in effect) gives its
  meta the next id, on every rank alike, since every rank runs the same responses in the same order.
  From then on that signature travels as its int id both ways (no meta pickled, compared by identity
  at the coordinator); a changed shape/dtype/op is a new meta, negotiated and checked in full, so
  mismatch and stall errors fire as before. Every op still gets its round trip through rank 0: that
  is what keeps ranks that issue ops in different orders matched.
- The common cases have short paths: `run()` for a blocking call, `_execute` for a lone CPU
  allreduce (Collectives.allreduce_one), groups (grouped_allreduce) as one entry and one reduction.
- Idle policy: a caller blocked in wait() keeps the driver lock and polls without yielding while it
  makes progress or for WAITER_SPIN_S after the last progress, then sleeps with growing delays up to
  MAX_SLEEP_S, letting other threads drive in between; the background thread yields the CPU after
  BACKGROUND_SPIN_S; with nothing outstanding it sleeps until a submit (rank 0 wakes periodically for
  stall checks).

Failure: a mismatch or stall response fails the named handles on every rank that submitted them; an
exception inside the engine fails every outstanding handle and closes the engine. `shutdown()` is
collective (it waits for every rank's shutdown, or the stall timeout), fails whatever is left, writes the
timeline and frees the communicators. `abort()` (a rank exiting after an unhandled exception) is not:
it tells the coordinator, which makes every other rank fail everything outstanding at once.
"""
from __future__ import annotations

import os
import threading
import time

from mpi4py import MPI

from trainrun.runtime import timeline as tl
from trainrun.runtime.backends.mpi import MPIBackend
from trainrun.runtime.collectives import Collectives
from trainrun.runtime.exceptions import HorovodInternalError, StallError, TensorMismatchError
from trainrun.runtime.negotiation import SHUTDOWN_NAME, Coordinator
from trainrun.runtime.ops import GROUP, Handle, Request

TAG_ANNOUNCE, TAG_RESPONSE = 1, 2
# A caller blocked in wait() has nothing better to do than poll; the background thread shares the
# core with the training loop (gradient hooks fire during backward), so it yields the CPU sooner.
WAITER_SPIN_S, BACKGROUND_SPIN_S, MAX_SLEEP_S = 0.002, 0.0001, 0.0002
CACHE_CAPACITY = 4096  # signatures remembered by the response cache (Horovod's default is 1024)
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
                 timeline_path: str | None = None):
        """Collective over `comm` (duplicates it twice). Starts the background thread."""
        self.rank, self.size = rank, size
        self._ctrl = comm.Dup()
        self._backend = MPIBackend(comm, wait=self._complete)
        self._timeline_path = timeline_path
        self._timeline = tl.Timeline(rank, self._ctrl.bcast(time.time(), root=0)) if timeline_path else None
        self._coll = Collectives(self._backend, rank, size, self._timeline)
        self._coord = Coordinator(size, fusion_threshold, stall_timeout) if rank == 0 else None
        self._tick = min(1.0, stall_timeout / 4)

        self._lock = threading.RLock()          # _cv's lock, taken directly on hot paths (C-level enter/exit)
        self._cv = threading.Condition(self._lock)
        self._queue: list[Request] = []      # submitted, not yet seen by the driver   (under _cv)
        self._names: set[str] = set()        # names outstanding on this rank            (under _cv)
        self._drivers = 0                    # callers in (or promised to enter) wait()  (under _cv)
        self._promised = 0                   # submit(caller_waits=True) not yet waiting (under _cv)
        self._closed = False                 # no more submits; driver stops             (under _cv)
        self._idle = False                   # the background thread waits on _cv        (under _cv)

        self._drive = threading.Lock()
        self._done_cv = threading.Condition()    # waiters that sleep between polls; notified on completion
        self._sleepers = 0                       # (under _done_cv)
        self._pending: dict[str, Request] = {}   # announced, waiting for a response   (driver only)
        self._sends: list = []                   # nonblocking control sends in flight  (driver only)
        self._shutdown_ok = False
        self._ids: dict[tuple, int] = {}         # response cache: meta -> id   (driver only; same on all ranks)
        self._by_id: list[tuple] = []            # id -> meta                    (driver only)
        self._cached: list[tuple] = []           # id -> its response            (driver only)

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
            self._queue.append(req)
            self._drivers += 1
        handle = req.handle
        try:
            self._drive_until(handle)
        finally:
            with self._lock:  # _cv's lock: notify_all below is allowed
                self._drivers -= 1
                if not self._drivers and (self._queue or self._names):
                    self._cv.notify_all()
        if handle.error is not None:
            raise handle.error
        return [handle.result]

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
        if self._shutdown_ok:  # every rank is here: safe to use collectives and free the communicators
            if self._timeline is not None:
                events = self._ctrl.gather(self._timeline.events, root=0)
                if self.rank == 0:
                    tl.write(self._timeline_path, events)
            MPI.Request.Waitall(self._sends)
            self._coll.close()
            self._backend.close()
            self._ctrl.Free()

    def abort(self, reason: str, grace_s: float = 1.0) -> None:
        """Stop this rank without waiting for the others (it is exiting after an unhandled exception).

        Tells the coordinator, which makes every other rank fail what it has outstanding at once
        instead of stalling; waits at most about 3 x `grace_s` (engine thread, lock, message). Not
        collective; the communicators are left to MPI_Finalize.
        """
        if self._thread is None:
            return
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(grace_s)
        self._thread = None
        if not self._drive.acquire(timeout=grace_s):  # a driver is stuck in a collective: just go
            return
        try:
            meta = [Request("abort", reason).meta()]
            if self._coord is not None:
                self._coord.submit(0, meta)
                self._sends += [self._ctrl.isend(self._coord.responses(), dest=d, tag=TAG_RESPONSE)
                                for d in range(1, self.size)]
            else:
                self._sends.append(self._ctrl.isend([self.rank] + meta, dest=0, tag=TAG_ANNOUNCE))
            deadline = time.monotonic() + grace_s
            while not MPI.Request.Testall(self._sends) and time.monotonic() < deadline:
                time.sleep(0.001)
        finally:
            self._drive.release()
        self._fail_all(HorovodInternalError(f"trainrun stopped on this rank: {reason}"))

    @property
    def reductions(self) -> int:
        """How many allreduce calls reached the backend so far (fusion makes this < tensors reduced)."""
        return self._coll.reductions

    # ---- the driver -------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = _Backoff(BACKGROUND_SPIN_S)
        while True:
            with self._cv:
                while not self._closed and (self._drivers or not (self._queue or self._names)):
                    self._idle = True
                    woken = self._cv.wait(self._tick)
                    self._idle = False
                    if not woken and self._coord is not None and not self._drivers:
                        break  # rank 0 idles, but still checks for stalls now and then
                if self._closed:
                    return
            if not self._drive.acquire(blocking=False):
                continue
            try:
                progressed = self._progress()
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
        """Wait for an MPI request of the running response: spinning while a caller waits on the
        engine, else (the background thread, overlapping the training loop) yielding the CPU between
        polls, so a late peer does not cost this rank's compute a core."""
        while not request.Test():
            if self._drivers:  # someone is blocked on the engine: nothing else to run here
                request.Wait()
                return
            os.sched_yield()

    def _progress(self) -> bool:
        """One round: announce new requests, (rank 0) negotiate, run responses. Caller holds _drive."""
        try:
            return self._round()
        except Exception as e:  # MPI or internal failure: nothing can be trusted to complete any more
            with self._cv:
                self._closed = True
            self._fail_all(HorovodInternalError(f"trainrun engine failed: {type(e).__name__}: {e}"))
            return True

    def _round(self) -> bool:
        """Announce, negotiate (rank 0), run. The hot path of every operation: kept free of per-poll
        allocations and lock round-trips when there is nothing to do."""
        if self._closed:
            return False
        progressed = False
        metas = None
        if self._queue:
            with self._lock:
                new, self._queue = self._queue, []
            progressed = True
            pending, ids, by_id = self._pending, self._ids, self._by_id
            metas, wire = [], [self.rank]
            for r in new:
                pending[r.name] = r
                m = r.meta()
                cid = r.cid = ids.get(m)  # the response cache: a signature run before travels as its id
                if cid is None:
                    metas.append(m)
                    wire.append(m)
                else:
                    metas.append(by_id[cid])  # the cached object: compared by identity from now on
                    wire.append(cid)
            if self._coord is None:
                self._sends.append(self._ctrl.isend(wire, dest=0, tag=TAG_ANNOUNCE))
        if self._sends and MPI.Request.Testall(self._sends):
            self._sends.clear()
        coord = self._coord
        if coord is not None:
            # announcements that arrived earlier go first (join() reports the last rank to join)
            by_id = self._by_id
            while (msg := self._ctrl.improbe(source=MPI.ANY_SOURCE, tag=TAG_ANNOUNCE)) is not None:
                src, *remote = msg.recv()
                coord.submit(src, [by_id[m] if m.__class__ is int else m for m in remote])
                progressed = True
            if metas:
                coord.submit(0, metas)
            if coord.due():
                responses = coord.responses()
                if responses:
                    wire = self._encode(responses)
                    for dest in range(1, self.size):
                        self._sends.append(self._ctrl.isend(wire, dest=dest, tag=TAG_RESPONSE))
                    self._execute(responses)
                    progressed = True
        else:
            while (msg := self._ctrl.improbe(source=0, tag=TAG_RESPONSE)) is not None:
                cached = self._cached
                self._execute([cached[r] if r.__class__ is int else r for r in msg.recv()])
                progressed = True
        return progressed

    def _encode(self, responses: list[tuple]) -> list:
        """Responses as sent: a cached allreduce (one name, no join, no error) as its id."""
        pending = self._pending
        out = []
        for resp in responses:
            if resp[0] == "allreduce" and resp[2] is None and len(resp[1]) == 1:
                req = pending.get(resp[1][0])
                if req is not None and req.cid is not None:
                    resp = req.cid
            out.append(resp)
        return out

    def _remember(self, req: Request) -> None:
        """Response cache: give a signature that just ran as a lone allreduce the next id. Every rank
        runs the same responses in the same order, so ids agree without being sent."""
        if req.cid is not None:
            return
        meta = req.meta()
        if meta not in self._ids and len(self._by_id) < CACHE_CAPACITY:
            self._ids[meta] = len(self._by_id)
            self._by_id.append(meta)
            self._cached.append(("allreduce", [req.name], None, None))

    def _execute(self, responses: list[tuple]) -> None:
        for kind, names, info, error in responses:
            if kind == "abort":
                with self._cv:
                    self._closed = True
                self._fail_all(HorovodInternalError(
                    f"trainrun: {error[1]}; collectives cannot complete (trainrun is shut down on this rank)"))
                return
            if error is not None:
                failed = [self._pending.pop(n) for n, ranks in zip(names, info) if self.rank in ranks]
                self._finish(failed, [None] * len(failed), _ERRORS[error[0]](error[1]))
                continue
            if len(names) == 1:
                req = self._pending.pop(names[0], None)
                if kind == "allreduce" and info is None and req is not None and req.splits is None \
                        and req.device == "cpu" and self._timeline is None:
                    self._remember(req)  # the common case, in as few steps as possible
                    self._finish_one(req, self._coll.allreduce_one(req))
                    continue
                reqs = [req]
            else:
                reqs = [self._pending.pop(n, None) for n in names]
                req = None
            if self._timeline is not None:
                now = self._timeline.now()
                for r in reqs:
                    if r is not None:
                        self._timeline.span([r.name], "NEGOTIATE", r.submitted, now)
            if kind == "allreduce" and ((req is not None and req.splits == GROUP)
                                        or (req is None and info is not None and len(info[5]) != len(names))):
                # a group: one fused reduction (zeros for all its tensors on a rank that has joined)
                results = [self._coll.allreduce_group(req, names, info)]
            else:
                results = self._coll.execute(kind, names, reqs, info)
            if kind == "shutdown":
                self._shutdown_ok = True
                with self._cv:
                    self._closed = True
            if req is not None:
                if kind == "allreduce" and info is None:
                    self._remember(req)
                self._finish(reqs, results, None)
            else:
                done = [(r, res) for r, res in zip(reqs, results) if r is not None]
                self._finish([r for r, _ in done], [res for _, res in done], None)

    def _finish_one(self, req: Request, result) -> None:
        handle = req.handle
        handle.result = result
        handle.done = True
        with self._lock:
            self._names.discard(req.name)
        if self._sleepers:
            with self._done_cv:
                self._done_cv.notify_all()

    def _finish(self, reqs: list[Request], results: list, error: BaseException | None) -> None:
        for r, res in zip(reqs, results):
            r.handle.finish(res, error)
        with self._lock:
            self._names.difference_update(r.name for r in reqs)
        if self._sleepers:
            with self._done_cv:
                self._done_cv.notify_all()

    def _fail_all(self, error: BaseException) -> None:
        with self._cv:
            left, self._queue = self._queue + list(self._pending.values()), []
        self._pending.clear()
        self._finish(left, [None] * len(left), error)
