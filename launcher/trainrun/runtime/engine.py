"""The engine: matches named operations across ranks, runs them in one agreed order, completes handles.

One engine per process set on each member rank. This module holds its face to user threads (submit,
run, wait, shutdown, abort) and its background thread; the work is split by concern:
driver.py (the agreement loop), lone.py (the lone-op path), completion.py (finishing handles).

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
- A lone blocking op (nothing else outstanding on this rank, cached signature) takes the lone-op
  path (lone.py): one round and its reduction inline, without the queue; `run` of one request and
  `allreduce_now` (a CPU allreduce given as arrays: not even a Request) both enter it.
- Idle policy (timing.py, waiting.py): a caller blocked in wait() keeps the driver lock and polls without
  yielding while it makes progress, or while waiting.POLICY lets a wait of that age spin (WAITER_SPIN_S
  after the last progress; under TRAINRUN_WAIT=auto only while the host has no more runnable tasks than
  cores), then sleeps with growing delays, letting other threads drive in between; the background
  thread yields the CPU for BACKGROUND_SPIN_S by the same rule, then sleeps.

OpFailure: a mismatch or stall response fails the named handles on every rank that submitted them; an
exception inside the engine fails every outstanding handle and closes the engine. `shutdown()` is
collective (it waits, taking part in rounds, for every rank's shutdown, with no stall timeout: ranks
finish at different times), fails whatever is left, writes the timeline and frees the communicators;
from the moment a rank submits it, the other ranks' ops it lacks fail at once (negotiation.py: it left).
A peer whose engine takes no part at all (stopped, gone) is the diag thread's to report (liveness()). `abort()` (a rank exiting after an unhandled exception) is not:
it flags its next round, and the phase that follows makes every other rank fail everything outstanding.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from time import perf_counter_ns

from trainrun.runtime import timeline as tl
from trainrun.runtime.backends.mpi import MPIBackend, transfers_in_progress
from trainrun.runtime.cache import CAPACITY, ResponseCache
from trainrun.runtime.collectives import Collectives
from trainrun.runtime.completion import Completion
from trainrun.runtime.driver import Driver
from trainrun.runtime.exceptions import HorovodInternalError
from trainrun.runtime.fusion import WIDENED
from trainrun.runtime.lone import LoneOp
from trainrun.runtime.messages import Meta
from trainrun.runtime.negotiation import SHUTDOWN_NAME, Coordinator
from trainrun.runtime.ops import Handle, Request
from trainrun.runtime.round_port import RoundPort
from trainrun.runtime.timing import BACKGROUND_SPIN_S, IDLE_S, MAX_SLEEP_S, WAITER_SPIN_S
from trainrun.runtime.waiting import POLICY, ROUND_SLEEP_S, TRANSFER_SPIN_S

_SHUT_DOWN = "trainrun has been shut down; call init() again to use collectives"
_new_tuple = tuple.__new__


class _Backoff:
    """How long a poller with nothing to do should wait: 0 (just yield) while waiting.POLICY lets a
    wait this long after the last progress spin (`spin_s` at most), then growing sleeps up to MAX_SLEEP_S
    (TRAINRUN_WAIT=spin) or waiting.ROUND_SLEEP_S."""

    def __init__(self, spin_s: float):
        self._spin = spin_s
        self.reset()

    def reset(self) -> None:
        self._since = time.monotonic()

    def delay(self) -> float:
        idle = time.monotonic() - self._since
        if POLICY.spins:  # TRAINRUN_WAIT=spin: the earlier rule, unchanged
            return 0.0 if idle < self._spin else min(MAX_SLEEP_S, idle / 16)
        return 0.0 if POLICY.spin(idle, self._spin) else POLICY.sleep_s(idle, ROUND_SLEEP_S)


class Engine(LoneOp, Driver, Completion):
    def __init__(self, comm, rank: int, size: int, *, fusion_threshold: int, stall_timeout: float, cache_capacity: int = CAPACITY,
                 timeline_path: str | None = None, set_id: int = 0, ranks: list[int] | None = None):
        """Collective over `comm` (duplicates it twice). Starts the background thread. `set_id` and
        `ranks` (global ranks of comm's members) name the process set it serves (process_sets.py)."""
        self.rank, self.size = rank, size
        self.set_id, self.ranks = set_id, list(range(size)) if ranks is None else ranks
        self._ctrl = comm.Dup()
        self._port = RoundPort(self._ctrl)  # the rounds' persistent MPI requests (round_port.py)
        self._backend = MPIBackend(comm)
        self._timeline_path = timeline_path
        self._timeline = tl.Timeline(rank, self._ctrl.bcast(time.time(), root=0)) if timeline_path else None
        self._coll = Collectives(self._backend, rank, size, self._timeline)
        # ranks fuse cached ops themselves: they must agree on the threshold, so rank 0's counts
        self._threshold, capacity = self._ctrl.bcast((fusion_threshold, cache_capacity), root=0)  # and cache ids
        self._coord = Coordinator(size, self._threshold, stall_timeout) if rank == 0 else None
        self._tick = min(1.0, stall_timeout / 4)
        self.stall_timeout = stall_timeout

        # shared with user threads (under _cv; its lock _lock is taken directly on hot paths)
        self._lock = threading.RLock()
        self._cv = threading.Condition(self._lock)
        self._queue: list[Request] = []      # submitted, not yet seen by the driver
        self._names: set[str] = set()        # names outstanding on this rank
        self._drivers = 0                    # callers in (or promised to enter) wait()
        self._promised = 0                   # submit(caller_waits=True) not yet waiting
        self._closed = False                 # no more submits; driver stops
        self._idle = False                   # the background thread waits on _cv
        self._abort_reason: str | None = None  # set by abort()
        self._failure: BaseException | None = None  # why the engine broke (completion._broken), else None

        self._drive = threading.Lock()           # held by whichever thread drives progress
        self._done_cv = threading.Condition()    # waiters that sleep between polls; notified on completion
        self._sleepers = 0                       # (under _done_cv)
        # driver-only state (whoever holds _drive): requests by stage, the round in flight, the cache
        self._fresh: list[Request] = []          # not announced, signature not cached
        self._bycid: dict[int, Request] = {}     # not announced, cached: in every round's mask
        self._mask = 0                           # bits of _bycid's ids
        self._announced: dict[str, Request] = {}  # sent to the coordinator, waiting for a response
        self._joining = False                    # this rank's join() is outstanding
        self._abort_sent = False
        self._inflight = None                    # the MPI request of the round in flight, if any;
        self._round_send = self._round_recv = None  # that round's buffers (the last round's, after it)
        self._round_words = 0
        self._rounds = 0                         # rounds completed (the background thread's sign of activity)
        self._cache = ResponseCache(capacity)
        self._partial_since: float | None = None  # rank 0: since when some cached op is ready on some ranks only
        self._shutdown_ok = False
        self._shutdown_begun = False
        self._shutdown_req: Request | None = None
        # straggler measurement (diag/perf.py reads these, once per window, without locks): plain ints,
        # a perf_counter_ns pair per blocking wait and a few int operations per round
        self.measure = os.environ.get("TRAINRUN_STRAGGLER", "1") != "0"
        self.wait_ns = 0        # time user threads spent blocked in this engine's collectives
        self.waits = 0          # blocking waits (wait_all, lone ops)
        self.collectives = 0    # cached ops run (each op of a fused batch counts)
        self.last = 0           # of those, ops whose round this rank was the last to join (ties count)
        self.steps = 0          # optimizer steps (torch DistributedOptimizer.synchronize)
        self.step_end = 0       # perf_counter_ns when the last step's synchronize ended, until backward begins
        self.before_ns = 0      # time from a step's end to the next backward's first gradient (loader, forward)
        self.reduced_bytes = 0  # allreduce payload (inputs' bytes): the monitor's throughput
        self._sent = self._sent_prev = 0  # the op bits of this round's and the previous round's contribution

        self._thread = threading.Thread(target=self._run, name="trainrun-engine", daemon=True)
        self._thread.start()

    # ---- called by user threads -------------------------------------------------------------
    def submit(self, reqs: list[Request], *, caller_waits: bool = False, wake: bool = True) -> None:
        """Queue requests (announced together). Raises ValueError for a name already in flight here,
        HorovodInternalError once the engine is closed.

        `caller_waits=True` promises an immediate `wait`/`wait_all` on them: the background thread is
        not woken, so the caller's own wait drives them without a thread hand-off. `wake=False` only
        leaves the background thread asleep, promising nothing: for a caller that will most likely
        wait soon (else the thread finds the requests within IDLE_S).
        """
        with self._lock:
            if self._closed:
                raise HorovodInternalError(_SHUT_DOWN)
            names = self._names
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
            if self._timeline is not None:
                now = self._timeline.now()
                for r in reqs:
                    r.submitted = now
            self._queue.extend(reqs)
            if caller_waits:
                self._drivers += 1
                self._promised += 1
            elif self._idle and (wake or self.size == 1):  # (one rank: its thread has no idle rounds)
                self._idle = False  # one wake-up per burst of submits: the thread takes the whole queue
                self._cv.notify_all()

    def run(self, reqs: list[Request]) -> list:
        """`submit(reqs, caller_waits=True)` then `wait_all` of their handles -- the path of every
        blocking call (api.run) -- or, for one request, the lone-op path where it applies. Returns the
        results or raises the first error."""
        if len(reqs) == 1:
            req = reqs[0]
            if self._lone(req.meta(), req):
                return [req.handle.result]
        self.submit(reqs, caller_waits=True)
        return self.wait_all([r.handle for r in reqs])

    def allreduce_now(self, send, recv, shape: tuple, dtype: str, name: str, op: int, postscale: float) -> bool:
        """`recv` = op over ranks of `send` (None: in place) times `postscale`, blocking, through the
        lone-op path without a Request (the latency of a lone small allreduce, and of a large one's
        start on a cold cache). For a CPU array whose storage is its wire dtype, without prescale.
        Returns False, having done nothing, where the path does not apply (the caller takes the
        general one); raises like run()."""
        if dtype in WIDENED:
            return False
        # Meta(...) via tuple's constructor, as Request.meta does
        meta = _new_tuple(Meta, (name, "allreduce", dtype, shape, op, 1.0, postscale, -1, None, "cpu"))
        return self._lone(meta, None, send, recv)

    def wait(self, handle: Handle):
        """Block until `handle` completes, driving progress meanwhile; return its result or raise its error."""
        return self.wait_all([handle])[0]

    def wait_all(self, handles: list[Handle]) -> list:
        """Block until every handle completes (driving progress); their results, or the first error."""
        t0 = perf_counter_ns() if self.measure else 0
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
                if not self._drivers and (self._queue or self._names):
                    self._cv.notify_all()  # the last driver left work behind: the background thread takes it
            if t0:
                self.wait_ns += perf_counter_ns() - t0
                self.waits += 1
        for handle in handles:
            if handle.error is not None:
                raise handle.error
        return [h.result for h in handles]

    def _drive_until(self, handle: Handle) -> None:
        """Drive progress until `handle` is done. The driver lock is held across polls while they make
        progress or are young (WAITER_SPIN_S, and waiting.POLICY allows it: under auto, not on an
        oversubscribed host): a blocked caller spins like a blocking MPI call would,
        with no yield or lock hand-off per poll (each costs microseconds, a yield on a loaded machine
        far more); after that it polls with growing sleeps and lets other threads drive in between."""
        backoff = None
        while not handle.done:
            if self._failure is not None:  # broken while this handle's request was being executed
                self._orphaned(handle)
                break
            if not self._drive.acquire(blocking=False):
                self._sleep(MAX_SLEEP_S, handle)   # another thread is driving
                continue
            try:
                last = time.monotonic()
                spin = POLICY.spin
                while not handle.done:
                    if self._progress():
                        last = time.monotonic()
                        backoff = None
                    elif not spin(time.monotonic() - last, WAITER_SPIN_S):
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

    def sleep_until(self, ready, timeout: float) -> None:
        """Sleep until `ready()` holds -- checked at once and whenever a handle of this engine completes
        -- or `timeout` s pass, driving nothing (the background thread drives): for a thread that waits
        on any of several handles (tensorflow/graph_ops.py). Counted as a sleeper before `ready()` is
        read, so a completion after that read notifies it."""
        with self._done_cv:
            self._sleepers += 1
            try:
                if not ready():
                    self._done_cv.wait(timeout)
            finally:
                self._sleepers -= 1

    def begin_shutdown(self) -> None:
        """Announce this rank's shutdown without waiting for it: from then on the other ranks' ops
        this rank never joined fail at once (negotiation.py: it left). Idempotent; shutdown() calls
        it. state.shutdown begins every engine's before waiting for any, so that a rank waiting in
        one engine's shutdown never owes the others an op of another engine's."""
        if self._thread is None or self._shutdown_begun:
            return
        self._shutdown_begun = True
        req = Request("shutdown", SHUTDOWN_NAME)
        try:
            self.submit([req])
            self._shutdown_req = req
        except HorovodInternalError:  # closed already (broken, aborted): nothing to wait for
            pass

    def shutdown(self) -> None:
        """Collective shutdown; idempotent. Fails what is still outstanding with HorovodInternalError."""
        if self._thread is None:
            return
        self.begin_shutdown()
        if self._shutdown_req is not None:
            try:
                self.wait(self._shutdown_req.handle)
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
            self._port.close()
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
    def fusion_threshold(self) -> int:
        """Bytes; rank 0's setting, which every rank uses."""
        return self._threshold

    @property
    def cache_capacity(self) -> int:
        """Signatures the response cache numbers; rank 0's setting, which every rank uses."""
        return self._cache.capacity

    @property
    def reductions(self) -> int:
        """How many allreduce calls reached the backend so far (fusion makes this < tensors reduced)."""
        return self._coll.reductions

    # ---- read by the diag thread's watchdog (diag/rankhook.py), once a second, without locks ------
    def liveness(self) -> tuple[int, int, bool] | None:
        """None while this rank waits for nothing (no op outstanding, no thread inside an MPI
        transfer); else (rounds completed, reductions made, whether a round is in flight). A rank
        that waits while the first two stay the same for the stall timeout waits on a peer whose
        engine takes no part in rounds at all: stopped, exited, in MPI_Finalize, or hung outside
        trainrun (a live peer's engine joins a round every IDLE_S even when idle, so the coordinator
        would name it in a StallError instead). The lone-op path's transfer has no name outstanding:
        it is found by the thread's frames (backends.mpi.transfers_in_progress)."""
        if self._thread is None or not (self._names or transfers_in_progress(sizes=False)):
            return None
        return self._rounds, self._coll.reductions, self._inflight is not None

    # bytes of each MPI data transfer this process is inside now (read from the threads' frames)
    transfers_in_progress = staticmethod(transfers_in_progress)

    def waiting_on(self) -> str:
        """What this rank waits for, in words: "allreduce 'x'", "shutdown", "allreduce 'a', broadcast 'b'
        and 3 more". Best effort: it reads the driver's state from another thread."""
        kinds: dict[str, str] = {}
        for source in (self._announced.values, self._bycid.values, lambda: self._fresh, lambda: self._queue):
            try:
                for r in list(source()):
                    kinds.setdefault(r.name, r.kind)
            except RuntimeError:  # changed size while copied: the names below still say enough
                pass
        try:
            names = sorted(set(self._names))
        except RuntimeError:
            names = []
        if any(n not in kinds for n in names):  # being executed (in no queue): a cached op is an allreduce
            kinds.update((m.name, m.kind) for m in list(self._cache.metas))
        words = ["shutdown" if n == SHUTDOWN_NAME else f"{kinds.get(n, 'collective')} '{n}'" for n in names[:3]]
        if not words:  # the lone-op path: no Request, the op is in the waiting thread's frames
            words = _lone_ops()
        return ", ".join(words) + (f" and {len(names) - 3} more" if len(names) > 3 else "") or "a collective"

    # ---- the background thread ----------------------------------------------------------------
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
            backend = self._backend
            caller_wait, backend.wait = backend.wait, self._yielding_wait  # (see _yielding_wait)
            try:
                progressed = self._progress(idle_round)
            finally:
                backend.wait = caller_wait
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

    def _yielding_wait(self, request) -> None:
        """How the background thread, while it drives, waits for an MPI request of a running
        collective: overlapping the training loop, it gives the CPU back between polls while nobody
        waits on the engine, so a late peer does not cost this rank's compute a core: it yields while
        waiting.POLICY lets it spin (TRANSFER_SPIN_S: under auto, only while the host has a core to
        spare), then sleeps (TRAINRUN_WAIT=spin: it only
        yields, as before). A caller's thread drives because it waits: its wait is the backend's
        default (waiting.Policy.wait_request)."""
        start = time.monotonic()
        spins = POLICY.spins
        while not self._drivers:
            if request.Test():
                return
            if spins:
                os.sched_yield()
                continue
            age = time.monotonic() - start
            if POLICY.spin(age, TRANSFER_SPIN_S):  # (a transfer moves only while polled: waiting.py)
                os.sched_yield()
            else:
                time.sleep(POLICY.sleep_s(age))
        POLICY.wait_request(request)  # someone is blocked on the engine: nothing else to run here


def _lone_ops() -> list[str]:
    """The ops threads of this process run by the lone-op path now, in words ("allreduce 'x'"): read
    from their frames (LoneOp._lone's `meta`), for the stuck watchdog only."""
    code = LoneOp._lone.__code__
    out = []
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code is code:
                meta = frame.f_locals.get("meta")
                out.append(f"{meta.kind} '{meta.name}'" if isinstance(meta, Meta) else "allreduce")
                break
            frame = frame.f_back
    return out


def _refuse(names) -> None:
    raise ValueError(f"Requested a collective on tensor name(s) {sorted(set(names))} while an operation "
                     "with the same name is still in flight on this rank; names must be unique")
