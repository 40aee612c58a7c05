"""The runtime's public state functions: init/shutdown, process sets, topology queries, handles.

Thin accessors over the one runtime object (context.RUNTIME) and the process-set registry
(process_sets.py); the bindings (api.py, trainrun.torch, trainrun.keras) and users call these.

`init()` is idempotent and collective (all ranks call it); `shutdown()` too, and it also runs at exit
-- except after an unhandled exception, when this rank aborts instead (Engine.abort), so the others
fail fast rather than wait for it. A rank's shutdown also fails at once the others' ops it never joined
("rank N stopped: it left ... while rank M waited in allreduce 'x'"), so that a rank whose program ends
early never leaves the others waiting.
Settings come from the environment at init, read once by horovod_env.read (TRAINRUN_* first, then Horovod's
HOROVOD_* names; its docstring lists every variable), and are handed down: the session (context.Session)
makes the waiting policy and the engines from them, the bindings read theirs through `settings()`. A bad
value fails init with ValueError naming the variable. Rank 0 prints, once per process, a line for each
HOROVOD_* variable that has no effect here (and, at log level info, the settings). Everything else raises
ValueError before init, as Horovod does.
"""
from __future__ import annotations

import atexit
import os
import sys
from typing import TYPE_CHECKING

from trainrun.runtime import horovod_env, waiting
from trainrun.runtime.context import RUNTIME, Session
from trainrun.runtime.exceptions import StallError
from trainrun.runtime.process_sets import ProcessSet, global_process_set  # noqa: F401 (ProcessSet: as before)
from trainrun.runtime.process_sets import engine_of, register, registered, unregister
from trainrun.runtime.topology import Topology

if TYPE_CHECKING:
    from trainrun.runtime.engine import Engine


def init(comm=None, process_sets=None) -> None:
    """Join the MPI world (mpi4py's COMM_WORLD, or the mpi4py communicator `comm`) and start the
    engine; register `process_sets` (ProcessSets or lists of ranks, the same on every rank)."""
    if process_sets == "dynamic":  # Horovod's switch for add_process_set after init: always on here
        process_sets = None
    if comm is not None and not hasattr(comm, "Split_type"):
        raise ValueError("comm must be an mpi4py communicator (lists of ranks are not supported)")
    with RUNTIME.lock:
        if RUNTIME.session is not None:
            if process_sets:
                raise ValueError("trainrun is initialized already: register more process sets with "
                                 "add_process_set() (init's process_sets apply to the first init only)")
            return
        from mpi4py import MPI

        from trainrun.runtime import rankhook
        from trainrun.runtime import topology

        comm = MPI.COMM_WORLD if comm is None else comm
        if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
            raise RuntimeError("trainrun needs MPI initialized with at least MPI_THREAD_SERIALIZED "
                               "(mpi4py's default is MULTIPLE; check mpi4py.rc.thread_level)")
        settings = horovod_env.read(os.environ)  # the rank side's one read (ValueError naming a bad variable)
        session = Session(topology.from_mpi(comm), comm, settings)
        engine = session.start_engine(comm, 0, list(range(session.topology.size)))
        if session.topology.rank == 0:
            _report_settings(session.settings, engine)
        session.sets[0] = global_process_set
        RUNTIME.session = session
        # stacks without ptrace, progress and stalls for the launcher (diag/)
        rankhook.install(settings.diag_fd, settings.stacks_dir, session.topology.rank)
        if not RUNTIME.exit_hooked:  # registered after mpi4py's own, so it runs before MPI_Finalize
            atexit.register(_at_exit)
            sys.excepthook = _noting_crash(sys.excepthook)
            RUNTIME.exit_hooked = True
    for ps in process_sets or ():
        add_process_set(ps)


def _report_settings(settings: horovod_env.Settings, engine: Engine) -> None:
    """Rank 0, at the first init of this process: the HOROVOD_* variables that have no effect (unless the log level
    is error or fatal), and at level info or below the settings the engine runs with (rank 0's, which all use)."""
    if RUNTIME.settings_reported:
        return
    RUNTIME.settings_reported = True
    lines = [] if settings.quiet else list(settings.notes)
    if settings.verbose:
        lines.append(f"trainrun: settings: fusion threshold {engine.fusion_threshold} B, cache capacity "
                     f"{engine.cache_capacity}, stall timeout {settings.stall_timeout:g} s, "
                     f"timeline {settings.timeline_path or 'off'}, log level {settings.log_level}, "
                     f"gradient buckets {settings.bucket_bytes} B")
    if lines:
        print("\n".join(lines), file=sys.stderr, flush=True)


def shutdown() -> None:
    """Collective; fails outstanding handles; init() may be called again afterwards."""
    session = RUNTIME.take_session()
    if session is None:
        return
    engines = session.shutdown_order()
    for engine in engines:  # every engine's at once (Engine.begin_shutdown), then wait for each
        engine.begin_shutdown()
    for engine in engines:
        engine.shutdown()
    session.close()


def _noting_crash(previous):
    def hook(*exc_info):
        RUNTIME.crashed = True
        if issubclass(exc_info[0], StallError):
            _abort_at_exit_unless_launched()
        previous(*exc_info)
    return hook


def _abort_at_exit_unless_launched() -> None:
    """The program dies of a StallError: a rank is absent, and MPI_Finalize at exit would wait for it
    for ever. Under trainrun the launcher ends the job (it names the absent rank with its stack:
    supervisor/job.py); under a launcher that cannot (a bare mpiexec, mpirun) mpi4py's exit calls
    MPI_Abort instead, which ends the whole MPI job, as `python -m mpi4py` does for any crash."""
    from trainrun.runtime import rankhook

    if rankhook.connected():
        return
    from mpi4py import MPI

    abort = getattr(MPI, "_set_abort_status", None)  # (mpi4py >= 3.1)
    if abort is not None:
        abort(1)


def _at_exit() -> None:
    """Normal exit: collective shutdown. Exit after an unhandled exception: abort, so the other ranks
    fail fast (HorovodInternalError naming this rank) instead of waiting for the stall timeout."""
    if RUNTIME.crashed:
        session = RUNTIME.take_session()
        for engine in session.shutdown_order() if session is not None else []:
            engine.abort("it exited with an unhandled exception")
    else:
        shutdown()


def is_initialized() -> bool:
    return RUNTIME.session is not None


# ---- process sets (process_sets.py) ----
add_process_set = register
remove_process_set = unregister
process_sets = registered
engine = engine_of  # the engine that runs ops on a process set (default: the global one) here

# ---- handles: ints, as in Horovod; shared by the NumPy and framework layers (handles.py) ----
# (the table's own methods, not wrappers: one call less per async op)
add_handle = RUNTIME.handles.add                   # add_handle(op_handles, finalize, eng=None) -> int
poll = RUNTIME.handles.poll                        # poll(handle) -> bool: completed?
synchronize = RUNTIME.handles.synchronize          # synchronize(handle): wait, forget, return its output
synchronize_all = RUNTIME.handles.synchronize_all  # synchronize_all(handles): the same, one wait per engine


# ---- where this rank is, and what is built in ----
def topology() -> Topology:
    return RUNTIME.current().topology


def settings() -> horovod_env.Settings:
    """What the runtime runs with (read from the environment once, at init: horovod_env.py)."""
    return RUNTIME.current().settings


def gpu_operations() -> str:
    """'nccl' or 'mpi': how this session reduces CUDA tensors (context.Session.gpu_operations)."""
    return RUNTIME.current().gpu_operations()


def wait_policy() -> waiting.Policy:
    """The session's waiting policy (TRAINRUN_WAIT's mode; a benchmark switches it with `set_mode`)."""
    return RUNTIME.current().policy


def size() -> int: return topology().size
def rank() -> int: return topology().rank
def local_size() -> int: return topology().local_size
def local_rank() -> int: return topology().local_rank
def cross_size() -> int: return topology().cross_size
def cross_rank() -> int: return topology().cross_rank
def is_homogeneous() -> bool: return topology().is_homogeneous
# what trainrun is built with (Horovod's probes): MPI only (mpi4py); no Gloo, DDL, oneCCL or ROCm
def mpi_enabled() -> bool: return True
def mpi_built() -> bool: return True
def gloo_enabled() -> bool: return False
def gloo_built() -> bool: return False
def rocm_built() -> bool: return False
def ddl_built() -> bool: return False
def ccl_built() -> bool: return False


def mpi_threads_supported() -> bool:
    """Whether MPI runs at MPI_THREAD_MULTIPLE (Horovod's meaning); raises before init, as Horovod does."""
    RUNTIME.current()
    from mpi4py import MPI
    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE


def start_timeline(file_path, mark_cycles=False) -> None:
    raise NotImplementedError("trainrun records a timeline for the whole run only: set TRAINRUN_TIMELINE "
                              "(or HOROVOD_TIMELINE) to a file path before init(); it is written at shutdown")


def stop_timeline() -> None:
    raise NotImplementedError("trainrun records a timeline for the whole run only (TRAINRUN_TIMELINE, "
                              "written at shutdown); it cannot be stopped early")


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

