"""Where this rank sits: global, local (same host) and cross (same local rank) coordinates.

The MPI world is the source of truth: size/rank from COMM_WORLD, local from a shared-memory split,
cross from splitting by local rank. When the launcher's env contract (the TRAINRUN_* variables
that trainrun.plan.envcontract writes) is present it must agree; a disagreement means the world was formed
wrongly (a PMI mistake, for one, gives size 1 with no error) and is raised as RuntimeError
rather than training on a wrong topology.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from trainrun.plan.coords import COORDS, RankCoords


@dataclass(frozen=True)
class Topology(RankCoords):
    """This rank's coordinates as the MPI world says, and whether every host runs as many ranks."""

    is_homogeneous: bool = True


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
    check_env(topo, os.environ)  # (the launcher's contract, not a setting: runtime/horovod_env.py's list says so)
    return topo


def check_env(topo: Topology, environ) -> None:
    """Raise RuntimeError naming every TRAINRUN_* coordinate that disagrees with the MPI world (or that is
    missing or not a number); nothing to check when the launcher set none (no TRAINRUN_RANK). The values are
    compared as they are, not validated first: a wrong contract is reported in full."""
    if "TRAINRUN_RANK" not in environ:
        return
    try:
        env = {field: int(environ[f"TRAINRUN_{field.upper()}"]) for field in COORDS}
    except (KeyError, ValueError) as e:
        raise RuntimeError(f"trainrun: the launcher's environment contract is incomplete or malformed ({e!r}); "
                           "was the rank started outside its launcher?") from None
    wrong = [f"TRAINRUN_{field.upper()}={env[field]} but MPI says {getattr(topo, field)}"
             for field in COORDS if env[field] != getattr(topo, field)]
    if wrong:
        raise RuntimeError("trainrun: the MPI world disagrees with the launcher's environment: "
                           + "; ".join(wrong)
                           + " (was the rank started outside its launcher, or did PMI set-up fail?)")
