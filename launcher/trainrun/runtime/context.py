"""The runtime's state, in one object: `RUNTIME`.

A `Runtime` lives as long as the process: the handle table (handles.py), the output buffer pool,
and, between init() and shutdown(), a `Session` -- the topology, the communicator init() joined, the
settings (read once by init: horovod_env.py), the waiting policy made from them (every engine of the
session waits by it), the choice of GPU operations, the registered process sets, this rank's engine for
each set it is in (set id 0: the global set), and the slots that name unnamed ops (`next_name`).
shutdown() drops the session whole, so a later init() starts afresh (settings read again, set ids and op
names from the start again, on every rank alike).

lifecycle.py's functions and process_sets.py's registry are thin accessors over it. This module knows
process sets only by their `ranks` and `process_set_id` (process_sets.py imports it, not the other
way round), and imports mpi4py and the engine only when a session starts.
"""
from __future__ import annotations

import threading

from typing import TYPE_CHECKING, Any, Protocol

from trainrun.runtime.fusion import OutputPool
from trainrun.runtime.handles import Handles
from trainrun.runtime.horovod_env import Settings  # read from TRAINRUN_*/HOROVOD_* at init (horovod_env.py)
from trainrun.runtime.topology import Topology
from trainrun.runtime.waiting import Policy

if TYPE_CHECKING:
    from trainrun.runtime.engine import Engine

NOT_INIT = "Horovod has not been initialized; use hvd.init()."


class RegisteredSet(Protocol):
    """What the session knows of a registered process set (process_sets.ProcessSet, which imports this
    module: named here by what it has, not imported)."""

    ranks: list[int]
    process_set_id: int | None


class Session:
    """What one init() .. shutdown() holds (see the module docstring)."""

    def __init__(self, topology: Topology, world: Any, settings: Settings):
        self.topology, self.world, self.settings = topology, world, settings
        self.policy = Policy(settings.wait_mode)  # how every engine of the session waits (waiting.py)
        self.engines: dict[int, Engine] = {}   # set id -> this rank's Engine, for the sets it is in
        self.sets: dict[int, RegisteredSet] = {}  # set id -> every registered ProcessSet (0: the global one)
        self.next_set_id = 1
        self._slots: dict[tuple, _Slots] = {}       # (set id, kind) -> the slots naming its unnamed ops
        self._slot_of: dict[str, tuple] = {}        # an unnamed op's name -> (its _Slots, its bit)
        self._gpu_operations: str | None = None     # "nccl" or "mpi", decided at the first CUDA op

    def start_engine(self, comm: Any, set_id: int, ranks: list[int]) -> Engine:
        """Make (collectively over `comm`) and register the engine of process set `set_id`."""
        from trainrun.runtime.engine import Engine

        s = self.settings
        engine = Engine(comm, comm.Get_rank(), comm.Get_size(), fusion_threshold=s.fusion_threshold,
                        stall_timeout=s.stall_timeout, cache_capacity=s.cache_capacity, set_id=set_id, ranks=ranks,
                        timeline_path=s.timeline_path if set_id == 0 else None, policy=self.policy,
                        measure=s.straggler)
        self.engines[set_id] = engine
        return engine

    def gpu_operations(self) -> str:
        """'nccl' or 'mpi': how this session reduces CUDA tensors (mpi: staged through host memory). The
        settings' choice, else nccl where libnccl loads; decided at the first CUDA op (loading the library
        is not free, and a CPU job never needs it), the same for the rest of the session. RuntimeError when
        nccl was asked for and the library does not load."""
        ops = self._gpu_operations
        if ops is None:
            from trainrun.runtime.backends import nccl

            ops = self._gpu_operations = nccl.gpu_operations(self.settings.gpu_operations)
        return ops

    def use_gpu_operations(self, choice: str) -> None:
        """Reduce CUDA tensors by `choice` ('nccl' or 'mpi') from the next op on: a benchmark's same-process A/B
        (scripts/bench_gpu.py). RuntimeError for nccl where the library does not load."""
        from trainrun.runtime.backends import nccl

        self._gpu_operations = nccl.gpu_operations(choice)

    def close(self) -> None:
        """After its engines have shut down: what the session holds beyond them (the policy's load reader)."""
        self.policy.close()

    def next_name(self, kind: str, set_id: int) -> str:
        """The name of the next unnamed `kind` op of this set: `<kind>.noname.<slot>`, the lowest slot
        not held by an unnamed async op this rank started and has not synchronized yet (`hold`).

        Ranks run the same program, so they start and synchronize unnamed ops in the same order and
        agree on every slot, as they would on a running counter -- but a blocking op, or a loop of
        async ops synchronized each step, reuses the same few names, so its signature stays in the
        response cache (engine.py) instead of being negotiated afresh on every call."""
        slots = self._slots.get((set_id, kind))
        if slots is None:
            slots = self._slots[(set_id, kind)] = _Slots()
        used = slots.used
        bit = (~used & (used + 1)).bit_length() - 1
        names = slots.names
        while len(names) <= bit:
            name = f"{kind}.noname.{len(names)}" if not set_id else f"{kind}.noname.set{set_id}.{len(names)}"
            self._slot_of[name] = (slots, len(names))
            names.append(name)
        return names[bit]

    def hold(self, name: str):
        """Hold the slot of unnamed op `name` (its async start) until `release(token)` (its
        synchronize); returns the token, None for a named op."""
        token = self._slot_of.get(name)
        if token is not None:
            token[0].used |= 1 << token[1]
        return token

    def shutdown_order(self) -> list[Engine]:
        """The engines to stop: process sets in id order, then the global one -- one order on every
        rank, so their collective shutdowns cannot wait on each other."""
        engines = self.engines
        return [engines[i] for i in sorted(engines) if i] + ([engines[0]] if 0 in engines else [])

    @staticmethod
    def release(token) -> None:
        token[0].used &= ~(1 << token[1])


class _Slots:
    """Slots of one (set, kind): `used`, a bitmask of the held ones; `names[i]`, slot i's name."""
    __slots__ = ("used", "names")

    def __init__(self) -> None:
        self.used = 0
        self.names: list[str] = []


class Runtime:
    """The process's runtime (see the module docstring). `lock` serializes init and shutdown."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.session: Session | None = None
        self.handles = Handles(lambda: self.current().engines[0])
        self.outputs = OutputPool()   # grouped outputs' buffers (api.py)
        # once per process, not per session: the interpreter's exit and excepthook, and rank 0's notes
        self.exit_hooked = False      # lifecycle.py's atexit/excepthook are installed
        self.settings_reported = False  # rank 0 printed the settings' notes (lifecycle.py), once per process
        self.crashed = False          # the interpreter is exiting after an unhandled exception

    def current(self) -> Session:
        """The session, or ValueError (Horovod's message) before init()."""
        session = self.session
        if session is None:
            raise ValueError(NOT_INIT)
        return session

    def take_session(self) -> Session | None:
        """End the session and return it (None if there is none) for the caller to stop its engines
        (`Session.shutdown_order`) and then `close` it. Registered sets other than the global one lose
        their ids."""
        with self.lock:
            session, self.session = self.session, None
        if session is None:
            return None
        for set_id, ps in session.sets.items():
            if set_id:
                ps.process_set_id = None
        return session


# The one runtime of the process (a module-level singleton on purpose): the handle table and the output
# pool outlive sessions (a handle made before shutdown() fails, it does not vanish), and the exit hooks are
# the interpreter's, installed once. What belongs to one init() .. shutdown() is in its Session.
RUNTIME = Runtime()
