"""Process-wide runtime state: init/shutdown, topology queries, and the handle table.

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

from trainrun.runtime.topology import Topology

_NOT_INIT = "Horovod has not been initialized; use hvd.init()."
_lock = threading.Lock()
_topology: Topology | None = None
_engine = None
_atexit_registered = False
_crashed = False  # set by the excepthook below: the interpreter is exiting after an unhandled exception


def _setting(name: str, default: str | None) -> str | None:
    return os.environ.get(f"TRAINRUN_{name}", os.environ.get(f"HOROVOD_{name}", default))


def init(comm=None, process_sets=None) -> None:
    """Join the MPI world (mpi4py's COMM_WORLD, or the mpi4py communicator `comm`) and start the engine.
    Process sets other than the global one are not supported (NotImplementedError)."""
    global _topology, _engine, _atexit_registered
    if process_sets:
        raise NotImplementedError("trainrun supports only the global process set")
    if comm is not None and not hasattr(comm, "Split_type"):
        raise ValueError("comm must be an mpi4py communicator (lists of ranks are not supported)")
    with _lock:
        if _engine is not None:
            return
        from mpi4py import MPI

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
        _topology = topo
        if not _atexit_registered:  # registered after mpi4py's own, so it runs before MPI_Finalize
            atexit.register(_at_exit)
            sys.excepthook = _noting_crash(sys.excepthook)
            _atexit_registered = True


def shutdown() -> None:
    """Collective; fails outstanding handles; init() may be called again afterwards."""
    global _topology, _engine
    with _lock:
        engine, _engine, _topology = _engine, None, None
    if engine is not None:
        engine.shutdown()


def _noting_crash(previous):
    def hook(*exc_info):
        global _crashed
        _crashed = True
        previous(*exc_info)
    return hook


def _at_exit() -> None:
    """Normal exit: collective shutdown. Exit after an unhandled exception: abort, so the other ranks
    fail fast (HorovodInternalError naming this rank) instead of waiting for the stall timeout."""
    global _topology, _engine
    if _crashed and _engine is not None:
        with _lock:
            engine, _engine, _topology = _engine, None, None
        engine.abort("it exited with an unhandled exception")
    else:
        shutdown()


def is_initialized() -> bool:
    return _engine is not None


def engine():
    if _engine is None:
        raise ValueError(_NOT_INIT)
    return _engine


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


def add_handle(op_handles: list, finalize) -> int:
    """Register the engine handles of one user-level op; `finalize(results)` builds what synchronize returns."""
    h = next(_handle_ids)
    _handles[h] = (op_handles, finalize)
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
    op_handles, finalize = op
    if len(op_handles) == 1:  # one engine handle: the usual case, without the list work below
        (h,) = op_handles
        if not h.done:
            engine().wait_all(op_handles)
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
    flat = [h for op_handles, _ in ops for h in op_handles]
    if not all(h.done for h in flat):
        engine().wait_all(flat)
    out = []
    for op_handles, finalize in ops:
        for h in op_handles:
            if h.error is not None:
                raise h.error
        out.append(finalize([h.result for h in op_handles]))
    return out
