"""Chrome trace (chrome://tracing, Perfetto) of every tensor's phases on every rank.

Each rank records complete ("X") events in memory: NEGOTIATE (submit -> response), PACK, the MPI
call (ALLREDUCE, ALLGATHER, ...) and UNPACK, one row (tid) per tensor name, one process (pid) per rank.
At shutdown the engine gathers all ranks' events to rank 0, which writes the one JSON file named by
TRAINRUN_TIMELINE. Timestamps are microseconds since rank 0's start (each rank's wall clock is shifted
by the offset measured at init), so spans line up across ranks on one host and roughly across hosts.
"""
from __future__ import annotations

import json
import time


class Timeline:
    def __init__(self, rank: int, origin_s: float):
        self.rank = rank
        self._origin = origin_s
        self._tids: dict[str, int] = {}
        self.events: list[dict] = []

    @staticmethod
    def now() -> float:
        return time.time()

    def span(self, names, phase: str, start_s: float, end_s: float) -> None:
        ts, dur = (start_s - self._origin) * 1e6, max((end_s - start_s) * 1e6, 0.01)
        for name in names:
            tid = self._tids.get(name)
            if tid is None:
                tid = self._tids[name] = len(self._tids) + 1
                self.events.append({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid,
                                    "args": {"name": name}})
            self.events.append({"name": phase, "ph": "X", "pid": self.rank, "tid": tid, "ts": ts, "dur": dur})


def write(path: str, per_rank_events: list[list[dict]]) -> None:
    """Write all ranks' events as one trace file (called on rank 0 only)."""
    events = [{"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}}
              for r in range(len(per_rank_events))]
    for evs in per_rank_events:
        events.extend(evs)
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
