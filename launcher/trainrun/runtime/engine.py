"""The engine: matches named operations across ranks, runs them in one agreed order, completes handles.

One engine per process set on each member rank. The Engine is a thin composition: it makes the
parts, hands each the others it talks to (explicitly, at construction), and is their face to user
threads (submit, run, wait, shutdown, abort) and to the diag thread. Each part owns its state:

  RequestQueue  submissions.py  queued requests, names outstanding, blocked callers, closed/abort flags
  Driver        driver.py       the agreement rounds and phases, requests by stage, the drive lock
  ResponseCache cache.py        signatures that ran, by id; fusion plans
  Dispatch      dispatch.py     the data planes by device (backends.Collectives: MPI, NCCL), chosen once
  Completion    completion.py   handles completed, names released, sleepers woken; why it broke
  Waiter        waiter.py       a blocked caller drives progress itself
  LoneOp        lone.py         one blocking allreduce with nothing else outstanding: one solo round, inline
  Background    background.py   the thread that drives while no caller does
  Meter         meter.py        straggler counters (wire/perf_line.py)

The waiting policy (the session's waiting.Policy, made from TRAINRUN_WAIT's setting at init) is given at
construction to the parts that wait (Waiter, LoneOp, Background, and the backend's TransferWait); so is the
straggler switch (`measure`, TRAINRUN_STRAGGLER) to the Meter. The engine reads no environment.

Threads and ownership:
- Any thread may `submit` Requests (gradient hooks do, in any order). Submission only queues.
- Progress happens in whichever thread holds the driver's lock: the background thread, or a caller
  blocked in `wait` -- that caller drives progress itself, so a blocking op costs no thread hand-off
  (the background thread stands aside while someone waits).

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
  yielding while it makes progress, or while the policy lets a wait of that age spin (WAITER_SPIN_S
  after the last progress; under TRAINRUN_WAIT=auto only while the host has no more runnable tasks than
  cores), then sleeps with growing delays, letting other threads drive in between (waiter.py); the
  background thread yields the CPU for BACKGROUND_SPIN_S by the same rule, then sleeps (background.py).

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
from types import FrameType
import time

from trainrun.runtime import timeline as tl
from trainrun.runtime.background import Background
from trainrun.runtime.backends.mpi import transfers_in_progress
from trainrun.runtime.cache import CAPACITY, ResponseCache
from trainrun.runtime.completion import Completion
from trainrun.runtime.dispatch import Dispatch, open_planes
from trainrun.runtime.driver import Driver
from trainrun.runtime.exceptions import HorovodInternalError
from trainrun.runtime.fusion import WIDENED
from trainrun.runtime.lone import LoneOp
from trainrun.runtime.messages import Meta
from trainrun.runtime.meter import Meter
from trainrun.runtime.negotiation import SHUTDOWN_NAME, Coordinator
from trainrun.runtime.ops import Handle, Request
from trainrun.runtime.submissions import RequestQueue
from trainrun.runtime.waiter import Waiter
from trainrun.runtime.waiting import Policy, TransferWait

_new_tuple = tuple.__new__


class Engine:
    def __init__(self, comm, rank: int, size: int, *, fusion_threshold: int, stall_timeout: float, cache_capacity: int = CAPACITY,
                 timeline_path: str | None = None, set_id: int = 0, ranks: list[int] | None = None,
                 policy: Policy, measure: bool = True):
        """Collective over `comm` (duplicates it twice). Starts the background thread. `set_id` and
        `ranks` (global ranks of comm's members) name the process set it serves (process_sets.py);
        `policy`: how its threads wait (waiting.py; the session's, from TRAINRUN_WAIT); `measure`: keep the
        straggler counters (meter.py; TRAINRUN_STRAGGLER)."""
        self.rank, self.size = rank, size
        self.set_id, self.ranks = set_id, list(range(size)) if ranks is None else ranks
        self.stall_timeout = stall_timeout
        self._ctrl = comm.Dup()  # the control communicator: rounds, phases, and the timeline's gather
        self._timeline_path = timeline_path
        self._timeline = tl.Timeline(rank, self._ctrl.bcast(time.time(), root=0)) if timeline_path else None
        # ranks fuse cached ops themselves: they must agree on the threshold, so rank 0's counts
        threshold, capacity = self._ctrl.bcast((fusion_threshold, cache_capacity), root=0)  # and cache ids

        self.meter = Meter(measure)
        self._queue = queue = RequestQueue(size)
        transfer_wait = TransferWait(policy, lambda: queue.drivers, size)
        self._dispatch = dispatch = Dispatch(*open_planes(comm, rank, size, self._timeline, transfer_wait.wait),
                                             self._timeline, self.meter)
        self.cache = ResponseCache(capacity)
        self._completion = completion = Completion(queue)
        self._driver = driver = Driver(
            self._ctrl, rank, queue=queue, cache=self.cache, dispatch=dispatch, completion=completion,
            meter=self.meter, coordinator=Coordinator(size, threshold, stall_timeout, ranks=self.ranks) if rank == 0 else None,
            threshold=threshold, tick=min(1.0, stall_timeout / 4), timeline=self._timeline)
        self._waiter = Waiter(queue=queue, driver=driver, completion=completion, meter=self.meter, policy=policy)
        self.wait_all = self._waiter.wait_all
        self._lone = LoneOp(queue=queue, driver=driver, cache=self.cache, dispatch=dispatch, meter=self.meter,
                            policy=policy, wait_all=self.wait_all, timeline=self._timeline).run
        self.fusion_threshold = threshold  # bytes; rank 0's setting, which every rank uses
        self._shutdown_begun = False
        self._shutdown_req: Request | None = None
        self._background = Background(queue=queue, driver=driver, policy=policy, transfer_wait=transfer_wait,
                                      size=size)

    # ---- called by user threads -------------------------------------------------------------
    def submit(self, reqs: list[Request], *, caller_waits: bool = False, wake: bool = True) -> None:
        """Queue requests (announced together). Raises ValueError for a name already in flight here,
        HorovodInternalError once the engine is closed.

        `caller_waits=True` promises an immediate `wait`/`wait_all` on them: the background thread is
        not woken, so the caller's own wait drives them without a thread hand-off. `wake=False` only
        leaves the background thread asleep, promising nothing: for a caller that will most likely
        wait soon (else the thread finds the requests within IDLE_S).
        """
        self._queue.submit(reqs, caller_waits, wake, self._timeline)

    def run(self, reqs: list[Request]) -> list:
        """`submit(reqs, caller_waits=True)` then `wait_all` of their handles -- the path of every
        blocking call (api.run) -- or, for one request, the lone-op path where it applies. Returns the
        results or raises the first error."""
        if len(reqs) == 1:
            req = reqs[0]
            if self._lone(req.meta(), req):
                return [req.handle.result]
        self._queue.submit(reqs, True, True, self._timeline)
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

    # wait_all(handles): block until every handle completes (driving progress); their results, or
    # the first error (Waiter.wait_all, set in __init__)

    def wait(self, handle: Handle):
        """Block until `handle` completes, driving progress meanwhile; return its result or raise its error."""
        return self.wait_all([handle])[0]

    def sleep_until(self, ready, timeout: float) -> None:
        """Sleep until `ready()` holds -- checked at once and whenever a handle of this engine completes
        -- or `timeout` s pass, driving nothing (the background thread drives): for a thread that waits
        on any of several handles (tensorflow/graph_ops.py)."""
        self._completion.sleep_until(ready, timeout)

    def begin_shutdown(self) -> None:
        """Announce this rank's shutdown without waiting for it: from then on the other ranks' ops
        this rank never joined fail at once (negotiation.py: it left). Idempotent; shutdown() calls
        it. lifecycle.shutdown begins every engine's before waiting for any, so that a rank waiting in
        one engine's shutdown never owes the others an op of another engine's."""
        if not self._background.running or self._shutdown_begun:
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
        if not self._background.running:
            return
        self.begin_shutdown()
        if self._shutdown_req is not None:
            try:
                self.wait(self._shutdown_req.handle)
            except HorovodInternalError:
                pass
        self._queue.close()
        self._background.join()
        self._driver.fail_all(HorovodInternalError("trainrun shut down before this operation completed"))
        if self._driver.shutdown_ok:  # every rank is here, no round in flight: safe to use collectives and free
            if self._timeline is not None:
                events = self._ctrl.gather(self._timeline.events, root=0)
                if self.rank == 0 and self._timeline_path is not None:  # (set whenever there is a timeline)
                    tl.write(self._timeline_path, events)
            self._dispatch.close()
            self._driver.close()
            self._ctrl.Free()

    def abort(self, reason: str, grace_s: float = 1.0) -> None:
        """Stop this rank without waiting for the others' collectives (it is exiting after an
        unhandled exception). Its next round carries the ABORT flag; in the phase that follows the
        coordinator makes every rank fail what it has outstanding at once, instead of stalling.
        Not collective. If the others do not take part within ~3 x `grace_s` (hung), the process
        exits at once (status 1): MPI_Finalize could otherwise wait forever on the round in flight."""
        if not self._background.running:
            return
        self._queue.abort(reason)
        if not self._background.join(3 * grace_s):
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(1)
        self._driver.fail_all(HorovodInternalError(f"trainrun stopped on this rank: {reason}"))

    @property
    def cache_capacity(self) -> int:
        """Signatures the response cache numbers; rank 0's setting, which every rank uses."""
        return self.cache.capacity

    @property
    def reductions(self) -> int:
        """How many allreduce calls reached the backends so far (fusion makes this < tensors reduced)."""
        return self._dispatch.reductions

    # ---- read by the diag thread's watchdog (runtime/rankhook.py), once a second, without locks ------
    def liveness(self) -> tuple[int, int, bool] | None:
        """None while this rank waits for nothing (no op outstanding, no thread inside an MPI
        transfer); else (rounds completed, reductions made, whether a round is in flight). A rank
        that waits while the first two stay the same for the stall timeout waits on a peer whose
        engine takes no part in rounds at all: stopped, exited, in MPI_Finalize, or hung outside
        trainrun (a live peer's engine joins a round every IDLE_S even when idle, so the coordinator
        would name it in a StallError instead). The lone-op path's transfer has no name outstanding:
        it is found by the thread's frames (backends.mpi.transfers_in_progress)."""
        if not self._background.running or not (self._queue.names or transfers_in_progress(sizes=False)):
            return None
        return self._driver.rounds, self._dispatch.reductions, self._driver.in_flight()

    # bytes of each MPI data transfer this process is inside now (read from the threads' frames)
    transfers_in_progress = staticmethod(transfers_in_progress)

    def waiting_on(self) -> str:
        """What this rank waits for, in words: "allreduce 'x'", "shutdown", "allreduce 'a', broadcast 'b'
        and 3 more". Best effort: it reads the parts' state from another thread."""
        kinds = self._driver.kinds()
        try:
            for r in list(self._queue.queued):
                kinds.setdefault(r.name, r.kind)
        except RuntimeError:  # changed size while copied: the names below still say enough
            pass
        try:
            names = sorted(set(self._queue.names))
        except RuntimeError:
            names = []
        if any(n not in kinds for n in names):  # being executed (in no queue): a cached op is an allreduce
            kinds.update((m.name, m.kind) for m in list(self.cache.metas))
        words = ["shutdown" if n == SHUTDOWN_NAME else f"{kinds.get(n, 'collective')} '{n}'" for n in names[:3]]
        if not words:  # the lone-op path: no Request, the op is in the waiting thread's frames
            words = _lone_ops()
        return ", ".join(words) + (f" and {len(names) - 3} more" if len(names) > 3 else "") or "a collective"


def _lone_ops() -> list[str]:
    """The ops threads of this process run by the lone-op path now, in words ("allreduce 'x'"): read
    from their frames (LoneOp.run's `meta`), for the stuck watchdog only."""
    code = LoneOp.run.__code__
    out = []
    frame: FrameType | None
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code is code:
                meta = frame.f_locals.get("meta")
                out.append(f"{meta.kind} '{meta.name}'" if isinstance(meta, Meta) else "allreduce")
                break
            frame = frame.f_back
    return out
