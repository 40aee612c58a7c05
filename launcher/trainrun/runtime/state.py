"""Process-wide runtime state: init/shutdown, process sets (one engine each), topology queries, and
the handle table.

`init()` is idempotent and collective (all ranks call it); `shutdown()` too, and it also runs at exit
-- except after an unhandled exception, when this rank aborts instead (Engine.abort), so the others
fail fast rather than wait for it.
Settings come from the environment, TRAINRUN_* first, then Horovod's HOROVOD_* names:
FUSION_THRESHOLD (bytes, default 64 MiB), STALL_TIMEOUT (seconds, default 60; Horovod's
STALL_SHUTDOWN_TIME_SECONDS is not read), TIMELINE (path of a Chrome trace written at shutdown).
Everything else raises ValueError before init, as Horovod does.
"""
from __future__ import annotations

import atexit
import itertools
import os
import sys
import threading

from trainrun.runtime.process_sets import ProcessSet, global_process_set
from trainrun.runtime.topology import Topology

_NOT_INIT = "Horovod has not been initialized; use hvd.init()."
_lock = threading.Lock()
_topology: Topology | None = None
_engine = None                      # the global process set's engine
_world = None                       # the communicator init() joined
_set_engines: dict[int, object] = {}  # process set id -> engine, for the sets this rank is in (not 0)
_sets: dict[int, ProcessSet] = {}     # every registered process set, by id
_next_set_id = 1
_atexit_registered = False
_crashed = False  # set by the excepthook below: the interpreter is exiting after an unhandled exception


def _setting(name: str, default: str | None) -> str | None:
    return os.environ.get(f"TRAINRUN_{name}", os.environ.get(f"HOROVOD_{name}", default))


def init(comm=None, process_sets=None) -> None:
    """Join the MPI world (mpi4py's COMM_WORLD, or the mpi4py communicator `comm`) and start the
    engine; register `process_sets` (ProcessSets or lists of ranks, the same on every rank)."""
    global _topology, _engine, _world, _atexit_registered
    if process_sets == "dynamic":  # Horovod's switch for add_process_set after init: always on here
        process_sets = None
    if comm is not None and not hasattr(comm, "Split_type"):
        raise ValueError("comm must be an mpi4py communicator (lists of ranks are not supported)")
    with _lock:
        if _engine is not None:
            if process_sets:
                raise ValueError("trainrun is initialized already: register more process sets with "
                                 "add_process_set() (init's process_sets apply to the first init only)")
            return
        from mpi4py import MPI

        from trainrun.diag import rankhook
        from trainrun.runtime import topology
        from trainrun.runtime.engine import Engine

        comm = MPI.COMM_WORLD if comm is None else comm
        if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
            raise RuntimeError("trainrun needs MPI initialized with at least MPI_THREAD_SERIALIZED "
                               "(mpi4py's default is MULTIPLE; check mpi4py.rc.thread_level)")
        topo = topology.from_mpi(comm)
        _engine = Engine(comm, topo.rank, topo.size,
                         fusion_threshold=int(_setting("FUSION_THRESHOLD", str(64 * 1024 * 1024))),
                         stall_timeout=float(_setting("STALL_TIMEOUT", "60")),
                         timeline_path=_setting("TIMELINE", None) or None)
        _topology, _world = topo, comm
        rankhook.install(_engine)  # stacks without ptrace, progress and stalls for the launcher (diag/)
        global_process_set.ranks = list(range(topo.size))
        _sets[0] = global_process_set
        if not _atexit_registered:  # registered after mpi4py's own, so it runs before MPI_Finalize
            atexit.register(_at_exit)
            sys.excepthook = _noting_crash(sys.excepthook)
            _atexit_registered = True
    for ps in process_sets or ():
        add_process_set(ps)


def _take_engines() -> list:
    """Forget every engine (the caller stops them): process sets in id order, then the global one --
    one order on every rank, so their collective shutdowns cannot wait on each other."""
    global _topology, _engine, _world, _next_set_id
    with _lock:
        engines = [_set_engines[i] for i in sorted(_set_engines)] + ([_engine] if _engine is not None else [])
        for ps in _sets.values():
            if ps is not global_process_set:
                ps.process_set_id = None
        _set_engines.clear()
        _sets.clear()
        _engine, _topology, _world, _next_set_id = None, None, None, 1
    from trainrun.runtime import requests
    requests.reset_names()  # set ids start at 1 again after init: so must their unnamed ops' numbers
    return engines


def shutdown() -> None:
    """Collective; fails outstanding handles; init() may be called again afterwards."""
    for engine in _take_engines():
        engine.shutdown()


def add_process_set(process_set) -> ProcessSet:
    """Register a process set (a ProcessSet or a list of global ranks) and return it. Collective over
    every rank: all call it, in the same order, with the same ranks (checked)."""
    global _next_set_id
    from mpi4py import MPI

    from trainrun.runtime.engine import Engine

    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    world, topo = _world, topology()
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:  # each set's engine thread calls MPI on its own
        raise RuntimeError("process sets need MPI initialized with MPI_THREAD_MULTIPLE (mpi4py's default)")
    # every rank takes part in this first collective whatever it passed, then every check below
    # decides the same everywhere (the registry is the same on every rank): no rank is left waiting
    everyone = world.allgather((ps.ranks, ps.process_set_id))
    if any(r != everyone[0] for r in everyone):
        raise ValueError(f"add_process_set: ranks disagree on the new set (ranks, id): {everyone}")
    if ps.process_set_id is not None:
        raise ValueError(f"{ps} is registered already")
    bad = [r for r in ps.ranks if not 0 <= r < topo.size]
    if bad or not ps.ranks:
        raise ValueError(f"process set ranks {ps.ranks} must be a non-empty subset of 0..{topo.size - 1}")
    if any(other.ranks == ps.ranks for other in _sets.values()):
        raise ValueError(f"a process set with ranks {ps.ranks} exists already")
    member = topo.rank in ps.ranks
    sub = world.Split(0 if member else MPI.UNDEFINED, topo.rank)
    set_id, _next_set_id = _next_set_id, _next_set_id + 1
    if member:
        engine = Engine(sub, sub.Get_rank(), sub.Get_size(),
                        fusion_threshold=int(_setting("FUSION_THRESHOLD", str(64 * 1024 * 1024))),
                        stall_timeout=float(_setting("STALL_TIMEOUT", "60")), set_id=set_id, ranks=ps.ranks)
        sub.Free()  # the engine made its own duplicates
        _set_engines[set_id] = engine
    ps.process_set_id = set_id
    _sets[set_id] = ps
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (collective over every rank); False for the global set or one not
    registered. Its engine shuts down on its members (outstanding ops fail)."""
    set_id = process_set.process_set_id
    if not set_id or _sets.get(set_id) is not process_set:
        return False
    engine = _set_engines.pop(set_id, None)
    del _sets[set_id]
    process_set.process_set_id = None
    if engine is not None:
        engine.shutdown()
    return True


def process_sets() -> list[ProcessSet]:
    """Every registered process set, by id (the global one first)."""
    return [_sets[i] for i in sorted(_sets)]


def _noting_crash(previous):
    def hook(*exc_info):
        global _crashed
        _crashed = True
        previous(*exc_info)
    return hook


def _at_exit() -> None:
    """Normal exit: collective shutdown. Exit after an unhandled exception: abort, so the other ranks
    fail fast (HorovodInternalError naming this rank) instead of waiting for the stall timeout."""
    if _crashed and _engine is not None:
        for engine in _take_engines():
            engine.abort("it exited with an unhandled exception")
    else:
        shutdown()


def is_initialized() -> bool:
    return _engine is not None


def engine(process_set: ProcessSet | None = None):
    """The engine that runs ops on `process_set` (default: the global set) on this rank."""
    if process_set is None or process_set is global_process_set:
        if _engine is None:
            raise ValueError(_NOT_INIT)
        return _engine
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set must be a ProcessSet, not {type(process_set).__name__}")
    eng = _set_engines.get(process_set.process_set_id)
    if eng is None:
        if _engine is None:
            raise ValueError(_NOT_INIT)
        if not isinstance(process_set, ProcessSet) or _sets.get(process_set.process_set_id) is not process_set:
            raise ValueError(f"{process_set!r} is not a registered process set (init(process_sets=...) or "
                             "add_process_set())")
        raise ValueError(f"rank {rank()} is not in process set {process_set.process_set_id} "
                         f"(ranks {process_set.ranks}): only its members may use it")
    return eng


def topology() -> Topology:
    if _topology is None:
        raise ValueError(_NOT_INIT)
    return _topology


def size() -> int: return topology().size
def rank() -> int: return topology().rank
def local_size() -> int: return topology().local_size
def local_rank() -> int: return topology().local_rank
def cross_size() -> int: return topology().cross_size
def cross_rank() -> int: return topology().cross_rank
def is_homogeneous() -> bool: return topology().is_homogeneous
def mpi_enabled() -> bool: return True
def mpi_built() -> bool: return True
def mpi_threads_supported() -> bool: return True
def gloo_enabled() -> bool: return False
def gloo_built() -> bool: return False
def rocm_built() -> bool: return False


def nccl_built() -> bool:
    from trainrun.runtime.backends import nccl
    return nccl.available()


def cuda_built() -> bool:
    """CUDA tensors are supported (reduced with NCCL, or staged through host memory) when torch has CUDA."""
    try:
        import torch
    except ImportError:
        return False
    return torch.backends.cuda.is_built()


# ---- handles: ints, as in Horovod; shared by the NumPy and framework layers ----
_handles: dict[int, tuple] = {}
_handle_ids = itertools.count(1)


def add_handle(op_handles: list, finalize, eng=None) -> int:
    """Register the engine handles of one user-level op, started on `eng` (default: the global
    set's); `finalize(results)` builds what synchronize returns."""
    h = next(_handle_ids)
    _handles[h] = (op_handles, finalize, eng)
    return h


def poll(handle: int) -> bool:
    """True when the op behind `handle` has completed (synchronize will not block)."""
    if handle not in _handles:
        raise ValueError(f"Invalid or already synchronized handle: {handle}")
    return all(h.done for h in _handles[handle][0])


def synchronize(handle: int):
    """Wait for `handle`, forget it, and return its output; raises HorovodInternalError on failure."""
    op = _handles.pop(handle, None)
    if op is None:
        raise ValueError(f"Invalid or already synchronized handle: {handle}")
    op_handles, finalize, eng = op
    if len(op_handles) == 1:  # one engine handle: the usual case, without the list work below
        (h,) = op_handles
        if not h.done:
            (eng or engine()).wait_all(op_handles)
        if h.error is not None:
            raise h.error
        return finalize([h.result])
    _handles[handle] = op
    return synchronize_all([handle])[0]


def synchronize_all(handles: list[int]) -> list:
    """synchronize() of several handles with one wait (cheaper than one call each); forgets them all."""
    try:
        ops = [_handles.pop(h) for h in handles]
    except KeyError as e:
        raise ValueError(f"Invalid or already synchronized handle: {e.args[0]}") from None
    by_engine: dict = {}  # ops of different process sets: one wait per engine
    for op_handles, _, eng in ops:
        by_engine.setdefault(eng or engine(), []).extend(op_handles)
    for eng, flat in by_engine.items():
        if not all(h.done for h in flat):
            eng.wait_all(flat)
    out = []
    for op_handles, finalize, _ in ops:
        for h in op_handles:
            if h.error is not None:
                raise h.error
        out.append(finalize([h.result for h in op_handles]))
    return out
