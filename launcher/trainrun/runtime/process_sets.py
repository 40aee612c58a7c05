"""Process sets (Horovod's hvd.ProcessSet): groups of ranks that run collectives among themselves.

A registered set has an id (0: the global set, every rank) and, on each of its member ranks, its own
engine on its own communicator -- its own names, response cache, rounds and coordinator -- so ops
on different sets never wait for each other. Registration and removal (`state.add_process_set`,
`state.remove_process_set`, or `init(process_sets=[...])`) are collective over every rank, in the
same order everywhere, as in Horovod (which needs HOROVOD_DYNAMIC_PROCESS_SETS=1 for the former;
trainrun always allows it). Ops take `process_set=`; `root_rank` stays a global rank, as in Horovod.
join() is global only, and the timeline (TRAINRUN_TIMELINE) records the global set's ops only.
Not supported: sets given as an MPI communicator (pass its ranks).
"""
from __future__ import annotations


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
        from trainrun.runtime import state
        me = state.rank()
        ranks = self._registered()
        return ranks.index(me) if me in ranks else -1

    def included(self) -> bool:
        return self.rank() >= 0

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([])  # every rank; its ranks are filled in by init()
global_process_set.process_set_id = 0
