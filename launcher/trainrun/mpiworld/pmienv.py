"""The PMI part of a rank's environment, alone: what LocalRanks needs for every MPI-enabled rank, without
importing the PMI server (mpiworld/pmi.py), which only a job whose ranks speak PMI needs."""
from __future__ import annotations


def socket_env(rank: int, size: int, fd: int) -> dict[str, str]:
    """The environment of a rank using Hydra's style: PMI over the inherited socket `fd`.

    The caller keeps `fd` open and at the same number in the child (`subprocess.Popen(pass_fds=[fd])`).
    Never set `PMI_PORT` next to these: without `PMI_ID` MPICH silently runs every rank as size 1.
    """
    return {"PMI_FD": str(fd), "PMI_RANK": str(rank), "PMI_SIZE": str(size)}
