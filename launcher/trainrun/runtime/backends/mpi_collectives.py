"""Run one coordinator response on this rank: the NumPy-side work around the backend's MPI calls.

`execute(kind, names, reqs, info)` is called by the engine (dispatch.py) for every CPU response, in the same order on every
rank; `reqs` are this rank's Requests for the response's names (None for a name this rank has not
submitted, which happens only for allreduce after this rank called join(): it contributes zeros).
It returns one result per request (the output array; (output, received_splits) for alltoall; the last
joined rank for join) or raises; the engine turns either into handle completions.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any
from itertools import accumulate

import numpy as np

from trainrun.runtime.fusion import WIDENED, FusionBuffer, pack, storage_dtype, unpack, wire_dtype
from trainrun.runtime.messages import Absent, JoinedInfo
from trainrun.runtime.ops import Request, split_rows, sum_then_scale


def _bytes(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


class MpiCollectives:
    """This rank's NumPy work for every CPU response, on `backend` (backends.mpi.MPIBackend): the
    backends.Collectives protocol for host memory, plus the engine's fast paths (allreduce_one,
    allreduce_arrays, allreduce_group) that the dispatch (dispatch.py) calls directly."""

    def __init__(self, backend, rank: int, size: int, timeline=None):
        self.backend, self.rank, self.size, self.timeline = backend, rank, size, timeline
        self._fusion = FusionBuffer()
        self.reductions = 0  # allreduce calls made on the backend (tests and benchmarks read it)

    def close(self) -> None:
        """Free the backend's communicator (collective: called at engine shutdown)."""
        self.backend.close()

    def _span(self, names, phase, t0):
        if self.timeline is not None:
            t1 = self.timeline.now()
            self.timeline.span(names, phase, t0, t1)
            return t1
        return 0.0

    def _clock(self) -> float:
        return self.timeline.now() if self.timeline is not None else 0.0

    def execute(self, kind: str, names: list[str], reqs: list[Request | None], info: Any) -> list:
        """Run one response (`info`: the coordinator's, by kind: negotiation.py's table)."""
        if kind == "allreduce":
            return self.allreduce(names, reqs, info)
        (req,) = reqs
        t0 = self._clock()
        result: Any = None
        if req is None:  # this rank has joined: it takes part without data (negotiation.Absent)
            self.absent(kind, info)
        elif kind == "allgather":
            # (info: the first dims per rank, or an Absent holding them while a rank that joined lacks the op)
            result = self.allgather(req, getattr(info, "dims", info))
        elif kind == "broadcast":
            result = self.broadcast(req)
        elif kind == "alltoall":
            result = self.alltoall(req, info)
        elif kind == "reducescatter":
            result = self.reducescatter(req)
        elif kind == "barrier":
            self.backend.barrier()
        elif kind == "join":
            result = info
        # (shutdown: nothing to move)
        self._span(names, kind.upper(), t0)
        return [result]

    def allreduce_one(self, req: Request):
        """allreduce() of one CPU request with no join in effect: the common case, kept short."""
        if req.dtype in WIDENED or req.prescale != 1.0:
            return self.allreduce([req.name], [req], None)[0]
        out = req.out
        self.allreduce_arrays(None if out is req.inp else req.inp, out, req.op, req.postscale)
        return out

    def allreduce_arrays(self, send: np.ndarray | None, recv: np.ndarray, op: int, post: float) -> None:
        """recv = op over ranks of send (None: in place) times `post`, for arrays of a wire dtype."""
        op, post = sum_then_scale(op, post, self.size)
        self.backend.allreduce(send, recv, op)
        self.reductions += 1
        if post != 1.0:
            np.multiply(recv, post, out=recv, casting="unsafe")

    def allreduce_group(self, req: Request | None, names, joined_info: JoinedInfo | None):
        """One reduction of a group (ops.Request: inputs of any shape and layout, contiguous outputs);
        None for a rank that joined (it adds zeros).
        Packed with one concatenate; reduced in place in the group's own fused output when it has
        one (nothing to unpack), else in the fusion buffer and copied out."""
        shapes: Sequence[tuple]
        if req is None:
            j = joined_info
            assert j is not None, "a rank without the group's request has joined: the coordinator sends JoinedInfo"
            dtype, op, pre, post, shapes = j.dtype, j.op, j.prescale, j.postscale, j.shapes
        else:
            dtype, op, pre, post, shapes = req.dtype, req.op, req.prescale, req.postscale, req.shape
        red_op, post = sum_then_scale(op, post, self.size)
        wire = wire_dtype(dtype)
        plain = wire == storage_dtype(dtype)
        t0 = self._clock()
        if plain and pre == 1.0 and post == 1.0 and req is not None and req.fused is not None:
            np.concatenate(req.inp, axis=None, out=req.fused)  # flattens any shape or layout
            t0 = self._span(names, "PACK", t0)
            self.backend.allreduce(None, req.fused, red_op)
            self.reductions += 1
            self._span(names, "ALLREDUCE", t0)
            return req.out
        counts = [math.prod(s) for s in shapes]
        if req is None:
            zeros = self._fusion.get(wire, sum(counts))
            zeros[...] = 0
            self.backend.allreduce(None, zeros, red_op)
            self.reductions += 1
            self._span(names, "ALLREDUCE", t0)
            return None
        fused = req.fused if plain and req.fused is not None else self._fusion.get(wire, sum(counts))
        if plain and pre == 1.0:
            np.concatenate(req.inp, axis=None, out=fused)  # flattens any shape or layout
        else:
            off = 0
            for a, c in zip(req.inp, counts):
                pack(a.reshape(-1), dtype, fused[off:off + c], pre)
                off += c
        t0 = self._span(names, "PACK", t0)
        self.backend.allreduce(None, fused, red_op)
        self.reductions += 1
        t0 = self._span(names, "ALLREDUCE", t0)
        if fused is req.fused:
            if post != 1.0:
                np.multiply(fused, post, out=fused, casting="unsafe")
        else:
            off = 0
            for o, c in zip(req.out, counts):
                if plain and post == 1.0:
                    np.copyto(o.reshape(-1), fused[off:off + c])
                else:
                    unpack(fused[off:off + c], dtype, o.reshape(-1), post)
                off += c
        self._span(names, "UNPACK", t0)
        return req.out

    def allreduce(self, names, reqs, joined_info: JoinedInfo | None) -> list:
        """One (possibly fused) reduction; zero-copy when it is a single tensor of a wire dtype."""
        some = next((r for r in reqs if r is not None), None)
        if some is not None:
            dtype, op, pre, post = some.dtype, some.op, some.prescale, some.postscale
            counts = [r.inp.size for r in reqs]
        else:
            j = joined_info
            assert j is not None, "a rank without the op's request has joined: the coordinator sends JoinedInfo"
            dtype, op, pre, post = j.dtype, j.op, j.prescale, j.postscale
            counts = [math.prod(s) for s in j.shapes]
        red_op, post = sum_then_scale(op, post, self.size)
        wire = wire_dtype(dtype)
        t0 = self._clock()
        if len(reqs) == 1 and some is not None and wire == storage_dtype(dtype):
            send = some.inp
            if pre != 1.0:
                np.multiply(some.inp, pre, out=some.out, casting="unsafe")
                send = None
            elif some.out is some.inp:
                send = None
            self.backend.allreduce(send, some.out, red_op)
            self.reductions += 1
            t0 = self._span(names, "ALLREDUCE", t0)
            if post != 1.0:
                np.multiply(some.out, post, out=some.out, casting="unsafe")
                self._span(names, "UNPACK", t0)
            return [some.out]
        buf = self._fusion.get(wire, sum(counts))
        offsets = [0, *accumulate(counts)]
        if some is not None and len(counts) > 1 and pre == 1.0 and wire == storage_dtype(dtype) \
                and all(r is not None for r in reqs):
            np.concatenate([r.inp for r in reqs], out=buf)  # the common case in one C call
        else:
            for r, c, off in zip(reqs, counts, offsets):
                if r is None:
                    buf[off:off + c] = 0
                else:
                    pack(r.inp, dtype, buf[off:off + c], pre)
        t0 = self._span(names, "PACK", t0)
        self.backend.allreduce(None, buf, red_op)
        self.reductions += 1
        t0 = self._span(names, "ALLREDUCE", t0)
        plain = post == 1.0 and wire == storage_dtype(dtype)
        for r, c, off in zip(reqs, counts, offsets):
            if r is None:
                continue
            if plain:
                r.out[...] = buf[off:off + c]  # (cheaper per call than np.copyto)
            else:
                unpack(buf[off:off + c], dtype, r.out, post)
        self._span(names, "UNPACK", t0)
        return [None if r is None else r.out for r in reqs]

    def allgather(self, req: Request, dim0s: list[int]) -> np.ndarray:
        row = math.prod(req.shape[1:])
        out = np.empty((sum(dim0s),) + tuple(req.shape[1:]), dtype=storage_dtype(req.dtype))
        self.backend.allgatherv(_bytes(req.inp), _bytes(out), [d * row * out.itemsize for d in dim0s])
        return out

    def absent(self, kind: str, info: Absent) -> None:
        """This rank's part in an allgather (no rows) or broadcast (received, dropped) it did not
        submit because it has joined."""
        item = storage_dtype(info.dtype).itemsize * math.prod(info.shape[1:] if kind == "allgather" else info.shape)
        if kind == "allgather":
            dims = info.dims
            assert dims is not None, "an allgather's Absent carries the first dims"
            out = np.empty(sum(dims) * item, dtype=np.uint8)
            self.backend.allgatherv(np.empty(0, np.uint8), out, [d * item for d in dims])
        else:
            self.backend.bcast(np.empty(item, dtype=np.uint8), info.root)

    def broadcast(self, req: Request) -> np.ndarray:
        if self.rank == req.root and req.out is not req.inp:
            np.copyto(req.out, req.inp)
        self.backend.bcast(_bytes(req.out), req.root)
        return req.out

    def alltoall(self, req: Request, splits: list) -> tuple:
        item = math.prod(req.shape[1:]) * storage_dtype(req.dtype).itemsize
        recv_splits = [splits[r][self.rank] for r in range(self.size)]
        out = np.empty((sum(recv_splits),) + tuple(req.shape[1:]), dtype=storage_dtype(req.dtype))
        self.backend.alltoallv(_bytes(req.inp), [s * item for s in splits[self.rank]],
                               _bytes(out), [s * item for s in recv_splits])
        return out, np.asarray(recv_splits, dtype=np.int32)

    def reducescatter(self, req: Request) -> np.ndarray:
        row = math.prod(req.shape[1:])
        counts = [n * row for n in split_rows(req.shape[0] if req.shape else 0, self.size)]
        red_op, post = sum_then_scale(req.op, req.postscale, self.size)
        wire = wire_dtype(req.dtype)
        if wire == storage_dtype(req.dtype) and req.prescale == 1.0:
            send = req.inp
        else:
            send = self._fusion.get(wire, req.inp.size)
            pack(req.inp, req.dtype, send, req.prescale)
        recv = req.out if wire == storage_dtype(req.dtype) else np.empty(req.out.size, dtype=wire)
        self.backend.reduce_scatter(send, recv, counts, red_op)
        if recv is not req.out or post != 1.0:
            unpack(recv, req.dtype, req.out, post)
        return req.out
