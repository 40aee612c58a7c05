"""RankCoords: where one rank sits in a job, the one definition every layer shares. Pure.

    rank, size               global
    local_rank, local_size   among the ranks on the same host
    cross_rank, cross_size   among the ranks with the same local rank (Horovod's definition; for
                             local rank 0 it is the host's index)

The launcher's placement extends it (RankAssignment: host, node, GPUs), the env contract carries it to
the rank (TRAINRUN_RANK ... TRAINRUN_CROSS_SIZE), and the runtime computes it again from the MPI world (Topology) and checks that the
two agree.
"""
from __future__ import annotations

from dataclasses import dataclass

COORDS = ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")


@dataclass(frozen=True)
class RankCoords:
    """A rank's place in the job: rank, size, and its local and cross coordinates (COORDS)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int

    def __post_init__(self) -> None:
        for r, s, what in ((self.rank, self.size, ""), (self.local_rank, self.local_size, "local_"),
                           (self.cross_rank, self.cross_size, "cross_")):
            if not 0 <= r < s:
                raise ValueError(f"{what}rank {r} out of range for {what}size {s}")
