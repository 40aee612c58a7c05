"""Process sets (Horovod's hvd.ProcessSet): groups of ranks that run collectives among themselves.

A registered set has an id (0: the global set, every rank) and, on each of its member ranks, its own
engine on its own communicator -- its own names, response cache, rounds and coordinator -- so ops
on different sets never wait for each other. Registration and removal (`state.add_process_set`,
`state.remove_process_set`, or `init(process_sets=[...])`) are collective over every rank, in the
same order everywhere, as in Horovod (which needs HOROVOD_DYNAMIC_PROCESS_SETS=1 for the former;
trainrun always allows it). Ops take `process_set=`; `root_rank` stays a global rank, as in Horovod.
join() is global only, and the timeline (TRAINRUN_TIMELINE) records the global set's ops only.
Not supported: sets given as an MPI communicator (pass its ranks).

This module holds the ProcessSet class and the registry (`register`, `unregister`, `engine_of`),
over the session in context.py. The global set is the one object `global_process_set`, never
changed: its ranks are read from the session (none before init).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, cast

from trainrun.runtime.context import RUNTIME, NOT_INIT

if TYPE_CHECKING:
    from trainrun.runtime.engine import Engine


class ProcessSet:
    """The ranks (global, sorted) of a process set; `process_set_id` once registered."""

    def __init__(self, ranks):
        if hasattr(ranks, "Get_group"):
            raise NotImplementedError("process sets from an MPI communicator are not supported by trainrun; "
                                      "pass the list of its global ranks")
        try:
            ranks = sorted(int(r) for r in ranks)
        except (TypeError, ValueError):
            raise ValueError(f"ProcessSet needs a list of integer ranks, got {ranks!r}") from None
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"ProcessSet ranks must be distinct, got {ranks}")
        self.ranks = ranks
        self.process_set_id: int | None = None

    def _registered(self) -> list[int]:
        if self.process_set_id is None:
            raise ValueError(f"{self} is not registered: pass it to init(process_sets=...) or add_process_set()")
        return self.ranks

    def size(self) -> int:
        return len(self._registered())

    def rank(self) -> int:
        """This process's rank within the set, or -1 when it is not a member."""
        me = RUNTIME.current().topology.rank
        ranks = self._registered()
        return ranks.index(me) if me in ranks else -1

    def included(self) -> bool:
        return self.rank() >= 0

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


class _GlobalProcessSet(ProcessSet):
    """Every rank of the session (none before init); id 0, always registered."""

    def __init__(self):
        self.process_set_id = 0

    @property
    def ranks(self) -> list[int]:
        session = RUNTIME.session
        return list(range(session.topology.size)) if session is not None else []


global_process_set: ProcessSet = _GlobalProcessSet()


def register(process_set) -> ProcessSet:
    """Register a process set (a ProcessSet or a list of global ranks) and return it. Collective over
    every rank: all call it, in the same order, with the same ranks (checked)."""
    from mpi4py import MPI

    session = RUNTIME.current()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    world, topo = session.world, session.topology
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
    if any(other.ranks == ps.ranks for other in session.sets.values()):
        raise ValueError(f"a process set with ranks {ps.ranks} exists already")
    member = topo.rank in ps.ranks
    sub = world.Split(0 if member else MPI.UNDEFINED, topo.rank)
    set_id, session.next_set_id = session.next_set_id, session.next_set_id + 1
    if member:
        session.start_engine(sub, set_id, ps.ranks)
        sub.Free()  # the engine made its own duplicates
    ps.process_set_id = set_id
    session.sets[set_id] = ps
    return ps


def unregister(process_set: ProcessSet) -> bool:
    """Unregister a process set (collective over every rank); False for the global set or one not
    registered. Its engine shuts down on its members (outstanding ops fail)."""
    session = RUNTIME.session
    set_id = process_set.process_set_id
    if session is None or not set_id or session.sets.get(set_id) is not process_set:
        return False
    engine = session.engines.pop(set_id, None)
    del session.sets[set_id]
    process_set.process_set_id = None
    if engine is not None:
        engine.shutdown()
    return True


def registered() -> list[ProcessSet]:
    """Every registered process set, by id (the global one first)."""
    session = RUNTIME.session
    # (the session holds them as RegisteredSet, what it needs of them: they are the ProcessSets registered here)
    return cast("list[ProcessSet]", [session.sets[i] for i in sorted(session.sets)] if session is not None else [])


def engine_of(process_set: ProcessSet | None = None) -> Engine:
    """The engine that runs ops on `process_set` (default: the global set) on this rank."""
    session = RUNTIME.session
    if process_set is None or process_set is global_process_set:
        if session is None:
            raise ValueError(NOT_INIT)
        return session.engines[0]
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set must be a ProcessSet, not {type(process_set).__name__}")
    if session is None:
        raise ValueError(NOT_INIT)
    set_id, ranks = process_set.process_set_id, process_set.ranks
    engine = session.engines.get(set_id) if set_id is not None else None
    if engine is None:
        if set_id is None or session.sets.get(set_id) is not process_set:
            raise ValueError(f"{process_set!r} is not a registered process set (init(process_sets=...) or "
                             "add_process_set())")
        raise ValueError(f"rank {session.topology.rank} is not in process set {set_id} "
                         f"(ranks {ranks}): only its members may use it")
    return engine
