"""Where this rank sits: global, local (same host) and cross (same local rank) coordinates.

The MPI world is the source of truth: size/rank from COMM_WORLD, local from a shared-memory split,
cross from splitting by local rank. When the launcher's env contract (TRAINRUN_*, read with
envcontract.read_rank_env) is present it must agree; a disagreement means the world was formed
wrongly (a PMI mistake, for one, gives size 1 with no error) and is raised as RuntimeError
rather than training on a wrong topology.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    is_homogeneous: bool

    def __post_init__(self):
        for r, s, what in ((self.rank, self.size, ""), (self.local_rank, self.local_size, "local_"),
                           (self.cross_rank, self.cross_size, "cross_")):
            if not 0 <= r < s:
                raise ValueError(f"{what}rank {r} out of range for {what}size {s}")


def from_mpi(comm) -> Topology:
    """Compute the topology with collectives on `comm` (all ranks must call), then check the env contract."""
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    cross = comm.Split(color=local.Get_rank(), key=comm.Get_rank())
    try:
        local_sizes = comm.allgather(local.Get_size())
        topo = Topology(rank=comm.Get_rank(), size=comm.Get_size(),
                        local_rank=local.Get_rank(), local_size=local.Get_size(),
                        cross_rank=cross.Get_rank(), cross_size=cross.Get_size(),
                        is_homogeneous=len(set(local_sizes)) == 1)
    finally:
        local.Free()
        cross.Free()
    check_env(topo, os.environ)
    return topo


_FIELDS = ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")


def check_env(topo: Topology, environ) -> None:
    """Raise RuntimeError naming every TRAINRUN_* variable that disagrees with the MPI world (the
    contract is read by envcontract.read_rank_env; nothing to check when the launcher set none)."""
    from trainrun.envcontract import read_rank_env

    try:
        env = read_rank_env(environ)
    except (KeyError, ValueError) as e:
        raise RuntimeError(f"trainrun: the launcher's environment contract is incomplete or malformed ({e!r}); "
                           "was the rank started outside its launcher?") from None
    if env is None:
        return
    wrong = [f"TRAINRUN_{field.upper()}={getattr(env, field)} but MPI says {getattr(topo, field)}"
             for field in _FIELDS if getattr(env, field) != getattr(topo, field)]
    if wrong:
        raise RuntimeError("trainrun: the MPI world disagrees with the launcher's environment: "
                           + "; ".join(wrong)
                           + " (was the rank started outside its launcher, or did PMI set-up fail?)")
