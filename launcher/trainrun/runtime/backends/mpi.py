"""MPI data plane over mpi4py on host (NumPy) buffers.

Every method is a blocking collective on the backend's private communicator: all ranks must call the
same methods in the same order (the engine guarantees that). Data-movement methods take byte views,
so they work for any dtype; reductions take arrays in a wire dtype (see fusion.wire_dtype).

Allreduce, the op gradients use, runs as MPI_Iallreduce completed by the `wait(request)` the backend
is given when made (waiting.TransferWait): MPICH's blocking calls spin on the CPU while the peer is
late, which starves the training loop when communication overlaps backward on a host with no spare
core; that wait polls as hard as its thread needs: the engine's background thread yields between
polls while nobody waits on the engine (runtime/waiting.py's policy); once the rank has nothing else
to run (a caller waits), the policy's sleeps between MPI_Tests or MPICH's MPI_Wait, whichever the rank
measured better for that size (runtime/transfer_tuner.py; MPI_Wait on a 4 KiB Iallreduce returns ~2 us
later than polling, scripts/bench_wait.py, so a few MPI_Tests come first).
Small allreduces (up to 8 KiB) run as persistent requests instead (SmallAllreduces).
"""
from __future__ import annotations

import sys
from types import FrameType

import numpy as np
from mpi4py import MPI

from trainrun.runtime.ops import Max, Min, Product, Sum

_MPI_OPS = {Sum: MPI.SUM, Min: MPI.MIN, Max: MPI.MAX, Product: MPI.PROD}


def _displs(counts):
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out


def allreduce_init(comm, send, recv, op):
    """A persistent allreduce request (MPI_Allreduce_init, MPI 4), or None from an MPI before 4.0
    (the same library on every rank, so every rank falls back alike). Making one is collective."""
    try:
        return comm.Allreduce_init(send, recv, op=op)
    except NotImplementedError:
        return None


SMALL_MAX = 8 << 10  # allreduces up to this size go through persistent requests (SmallAllreduces)
SMALL_KEPT = 32      # persistent requests kept per communicator, the oldest dropped first


class SmallAllreduces:
    """Small allreduces as persistent requests (MPI_Allreduce_init) on buffers of their own: copy in,
    MPI_Start, copy out. Measured with MPICH 5 on 2 ranks: 4 KiB 4.35 -> 3.71 us, 8 KiB 5.50 -> 5.24
    us against a fresh MPI_Iallreduce (building its schedule is most of a small one's cost); from 16
    KiB the copies cost more than that saves. One request per (size, dtype, op).

    Ordering: making a persistent collective request is itself collective (every rank of the
    communicator, in the same order as its other collectives). Every rank's engine runs the same
    allreduces in the same order with the same sizes, so every rank meets a new key, and drops the
    oldest one, at the same point: the table stays the same everywhere. Only one
    allreduce is in flight on the communicator at a time, so one buffer per request suffices.
    An MPI before 4.0 (no MPI_Allreduce_init) gets MPI_Iallreduce."""

    def __init__(self, comm):
        self._comm = comm
        self._kept: dict[tuple, tuple] = {}  # (nbytes, dtype, op) -> (request, buffer), oldest first
        self._persistent = True

    def allreduce(self, send: np.ndarray | None, recv: np.ndarray, op: int, wait) -> None:
        entry = self._kept.get((recv.nbytes, recv.dtype, op))
        if entry is None:
            entry = self._make(recv, op)
            if entry is None:
                wait(self._comm.Iallreduce(MPI.IN_PLACE if send is None else send, recv, op=_MPI_OPS[op]), recv.nbytes)
                return
        request, buf = entry
        buf[...] = recv if send is None else send
        request.Start()
        wait(request, recv.nbytes)
        recv[...] = buf

    def _make(self, recv: np.ndarray, op: int):
        """A new (request, buffer) for recv's size, dtype and op, the oldest dropped beyond SMALL_KEPT;
        None if the MPI has no persistent collectives."""
        if not self._persistent:
            return None
        buf = np.empty(recv.size, recv.dtype)
        request = allreduce_init(self._comm, MPI.IN_PLACE, buf, _MPI_OPS[op])
        if request is None:
            self._persistent = False
            return None
        kept = self._kept
        if len(kept) >= SMALL_KEPT:
            kept.pop(next(iter(kept)))[0].Free()
        entry = kept[(recv.nbytes, recv.dtype, op)] = (request, buf)
        return entry

    def close(self) -> None:
        """Free the requests (none in flight): before the communicator is freed."""
        for request, _ in self._kept.values():
            request.Free()
        self._kept.clear()


class MPIBackend:
    """Collectives on a duplicate of `comm`; call `close()` to free it. `wait(request, nbytes)` completes a
    nonblocking MPI request moving `nbytes` (waiting.TransferWait.wait)."""

    def __init__(self, comm, wait):
        self.comm = comm.Dup()
        self._wait = wait
        self._small = SmallAllreduces(self.comm)

    def close(self) -> None:
        self._small.close()
        self.comm.Free()

    def allreduce(self, send: np.ndarray | None, recv: np.ndarray, op: int) -> None:
        """recv = op over ranks of send (in place on recv when send is None); flat contiguous arrays, as
        every caller in the engine passes (SmallAllreduces keys its buffers by size, not shape)."""
        if recv.nbytes <= SMALL_MAX:
            self._small.allreduce(send, recv, op, self._wait)
            return
        self._wait(self.comm.Iallreduce(MPI.IN_PLACE if send is None else send, recv, op=_MPI_OPS[op]), recv.nbytes)

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


def transfers_in_progress(sizes: bool = True) -> list[int]:
    """Bytes of each MPI data transfer some thread of this process is inside now (this module's
    frames, read from outside: sys._current_frames); with `sizes` False, one 0 per transfer (the
    frames' locals are not read). For the stuck watchdog (runtime/rankhook.py) only, once a second; the
    collectives themselves pay nothing for it."""
    codes = _transfer_codes()
    out = []
    frame: FrameType | None
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code in codes:
                if not sizes:
                    out.append(0)
                    break
                local = frame.f_locals
                found = [n for k in ("recv", "buf", "send") if isinstance(n := getattr(local.get(k), "nbytes", None), int)]
                out.append(max(found, default=0))
                break
            frame = frame.f_back
    return out


_CODES: set = set()


def _transfer_codes() -> set:
    """The code of this module's data-moving functions (whose locals hold the arrays moved)."""
    if not _CODES:
        b = MPIBackend
        _CODES.update(f.__code__ for f in (SmallAllreduces.allreduce, b.allreduce, b.allgatherv, b.bcast,
                                           b.alltoallv, b.reduce_scatter, b.barrier))
    return _CODES
