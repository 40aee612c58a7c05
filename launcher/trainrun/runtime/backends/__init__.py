"""Data-plane backends: the primitives the engine's collectives are built from (mpi.py, and on them
mpi_collectives.py, the MPI data plane; nccl.py for CUDA),
and the one interface the engine runs agreed responses through (`Collectives`).

Which implementation serves which device is chosen once, when an engine is made at session start
(dispatch.open_planes): host memory -> mpi_collectives.MpiCollectives over mpi.MPIBackend; CUDA ->
nccl.NcclPlane. Nothing below that choice looks at devices again.
"""
from __future__ import annotations

from typing import Protocol


class Collectives(Protocol):
    """One device's collectives. Every method is collective: all ranks call them in the same order
    (the engine's agreed order)."""

    reductions: int  # allreduce calls made so far (the stuck watchdog and the benchmarks read it)

    def execute(self, kind: str, names: list[str], reqs: list, info) -> list:
        """Run one response of `kind` for `names`: `reqs` are this rank's Requests (None for a name it
        has not submitted: it has joined), `info` the coordinator's (messages.JoinedInfo, Absent, dims,
        splits, or None). One result per request, or raises."""
        ...

    def close(self) -> None:
        """Free what the plane holds (collective, at engine shutdown, nothing in flight)."""
        ...
