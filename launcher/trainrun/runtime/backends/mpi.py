"""MPI data plane over mpi4py on host (NumPy) buffers.

Every method is a blocking collective on the backend's private communicator: all ranks must call the
same methods in the same order (the engine guarantees that). Data-movement methods take byte views,
so they work for any dtype; reductions take arrays in a wire dtype (see fusion.wire_dtype).

Allreduce, the op gradients use, runs as MPI_Iallreduce completed by the engine's `wait(request)`:
MPICH's blocking calls spin on the CPU while the peer is late, which starves the training loop
when communication overlaps backward on a host with no spare core; the engine's wait polls as hard
as its caller needs (see Engine._yielding_wait). A caller's wait (`spin_then_wait`) polls with
MPI_Test first: measured with MPICH 5 on 2 ranks, MPI_Wait on a 4 KiB Iallreduce returns ~2 us later
than polling it does (7.5 vs 5.6 us, blocking MPI_Allreduce 6.2 us), and never sooner at any size.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from trainrun.runtime.ops import Max, Min, Product, Sum

_MPI_OPS = {Sum: MPI.SUM, Min: MPI.MIN, Max: MPI.MAX, Product: MPI.PROD}
SPIN_TESTS = 256  # MPI_Test polls before MPI_Wait: ~100 us, a small op's whole time; a large op then
                  # waits in MPI_Wait, which releases the GIL to the program's other threads


def spin_then_wait(request) -> None:
    """Complete `request`: poll it SPIN_TESTS times, then MPI_Wait."""
    test = request.Test
    for _ in range(SPIN_TESTS):
        if test():
            return
    request.Wait()


def _displs(counts):
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out


class MPIBackend:
    """Collectives on a duplicate of the world communicator; call `close()` to free it."""

    def __init__(self, comm):
        self.comm = comm.Dup()
        # wait(request) completes a nonblocking MPI request: spin_then_wait, unless the engine's
        # background thread, while it drives, sets a wait that yields the CPU between polls
        self.wait = spin_then_wait

    def close(self) -> None:
        self.comm.Free()

    def allreduce(self, send: np.ndarray | None, recv: np.ndarray, op: int) -> None:
        """recv = op over ranks of send (in place on recv when send is None)."""
        self.wait(self.comm.Iallreduce(MPI.IN_PLACE if send is None else send, recv, op=_MPI_OPS[op]))

    def allgatherv(self, send: np.ndarray, recv: np.ndarray, counts: list[int]) -> None:
        """Byte arrays: rank r's `send` (counts[r] bytes) lands at offset sum(counts[:r]) of `recv`."""
        self.comm.Allgatherv(send, [recv, counts, _displs(counts), MPI.BYTE])

    def bcast(self, buf: np.ndarray, root: int) -> None:
        self.comm.Bcast([buf, MPI.BYTE], root=root)

    def alltoallv(self, send: np.ndarray, send_counts: list[int], recv: np.ndarray, recv_counts: list[int]) -> None:
        """Byte arrays: send_counts[r] bytes go to rank r; recv_counts[r] bytes come from rank r."""
        self.comm.Alltoallv([send, send_counts, _displs(send_counts), MPI.BYTE],
                            [recv, recv_counts, _displs(recv_counts), MPI.BYTE])

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, counts: list[int], op: int) -> None:
        """Reduce `send` over ranks; rank r keeps elements [sum(counts[:r]), +counts[r]) in `recv`."""
        self.comm.Reduce_scatter(send, recv, counts, op=_MPI_OPS[op])

    def barrier(self) -> None:
        self.comm.Barrier()
