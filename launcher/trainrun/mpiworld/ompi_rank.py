"""`python -m trainrun.mpiworld.ompi_rank COUNTS JOB PROGRAM...`: what mpirun starts for each rank of an
Open MPI job (supervisor/mpirun.py). It reads the rank's place from Open MPI (OMPI_COMM_WORLD_*), builds the same
RankAssignment trainrun's placement would (`COUNTS`: ranks per node, "2 2 1"; block placement), sets the
env contract with envcontract.rank_env (`JOB`: JobInfo.to_arg()) and the horovod shim's PYTHONPATH
(trainrun/_horovod), and execs PROGRAM.
"""
from __future__ import annotations

import os
import socket
import sys

from trainrun.plan.horovod_shim import rank_env as with_horovod_shim
from trainrun.plan.envcontract import JobInfo, rank_env
from trainrun.plan.hosts import HostSpec
from trainrun.plan.placement import RankAssignment, cross_coords


def assignment_from_ompi(environ, counts: list[int]) -> RankAssignment:
    """This rank's RankAssignment from Open MPI's variables. Pure."""
    def get(name: str) -> int:
        return int(environ[f"OMPI_COMM_WORLD_{name}"])

    rank, local = get("RANK"), get("LOCAL_RANK")
    # Block placement (--map-by slot): the node is where the running count passes the rank. (Open MPI's
    # OMPI_COMM_WORLD_NODE_RANK is a per-node process index, not the node's.)
    node, first = 0, 0
    while first + counts[node] <= rank:
        first += counts[node]
        node += 1
    cross_rank, cross_size = cross_coords(counts, node, local)
    return RankAssignment(rank=rank, size=get("SIZE"), local_rank=local, local_size=get("LOCAL_SIZE"),
                          cross_rank=cross_rank, cross_size=cross_size, node_rank=node, nnodes=len(counts),
                          host=HostSpec(socket.gethostname()))


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: python -m trainrun.mpiworld.ompi_rank COUNTS JOB PROGRAM...", file=sys.stderr)
        return 2
    counts = [int(c) for c in argv[0].split()]
    env = rank_env(assignment_from_ompi(os.environ, counts), JobInfo.from_arg(argv[1]))
    os.environ.update(env)
    os.environ.update(with_horovod_shim(dict(os.environ)))  # `import horovod` gives trainrun's (_horovod)
    os.execvp(argv[2], argv[2:])
    return 127  # not reached: execvp raises when the program is missing


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
