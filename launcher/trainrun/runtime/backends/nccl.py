"""NCCL backend for CUDA tensors: ctypes over libnccl.so.2, device memory held by torch.

Tested on a GPU machine by tests/runtime/test_gpu.py (CPU-only machines skip it with "no GPU").

- The library is found as `libnccl.so.2` on the loader path (or already loaded by torch), else in an
  nvidia-nccl-cu* wheel (`nvidia/nccl/lib/`, `nvidia/cu*/lib/`), else next to torch's libraries;
  `available()` never raises.
- `NcclPlane` (the backends.Collectives protocol for CUDA requests, chosen at session start:
  dispatch.open_planes) creates `NcclCollectives` when it runs its first CUDA response, on every rank at
  the same point of the agreed order: rank 0 makes the unique id, MPI broadcasts it over the data
  communicator, every rank calls ncclCommInitRank on the device of its first CUDA tensor (one GPU
  per rank: pin it with torch.cuda.set_device(local_rank), as Horovod scripts do). NCCL refuses two
  ranks on one GPU; the ranks first compare their (host, GPU) so that case is a clear error naming
  them and the fix, not NCCL's "invalid usage".
- Work runs on a private stream that first waits for each request's `ready` event (recorded on the
  producer's stream at submit); the engine thread then waits for the stream, so a completed handle
  means the output is written. Data movement uses byte counts (any dtype); reductions use NCCL's
  native types (float16/bfloat16 included). Ragged allgather pads to the longest rank; reducescatter
  is an allreduce plus a slice (twice the traffic, any split); alltoall is grouped send/recv.
"""
from __future__ import annotations

import ctypes
import math
import os
from functools import lru_cache

from trainrun.runtime.ops import Max, Min, Product, Sum, split_rows, sum_then_scale

_DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6,
           "float32": 7, "float64": 8, "bfloat16": 9}
_OPS = {Sum: 0, Product: 1, Max: 2, Min: 3}
_UINT8 = 1


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def _candidates():
    yield "libnccl.so.2"
    import glob
    import sys
    for entry in sys.path:  # the wheels' layouts: nvidia/nccl/lib (CUDA 12), nvidia/cu13/lib (CUDA 13)
        for pattern in ("nvidia/nccl/lib/libnccl.so.2", "nvidia/cu*/lib/libnccl.so.2"):
            yield from sorted(glob.glob(os.path.join(entry or ".", pattern)))
    try:
        import importlib.util
        spec = importlib.util.find_spec("torch")
        if spec and spec.origin:
            yield os.path.join(os.path.dirname(spec.origin), "lib", "libnccl.so.2")
    except ImportError:
        pass


@lru_cache(maxsize=1)
def _lib():
    """The loaded library with argtypes set, or None."""
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError:
            continue
    else:
        return None
    p, i, sz, comm = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p
    sigs = {
        "ncclGetUniqueId": [ctypes.POINTER(_UniqueId)],
        "ncclCommInitRank": [ctypes.POINTER(ctypes.c_void_p), i, _UniqueId, i],
        "ncclCommDestroy": [comm],
        "ncclAllReduce": [p, p, sz, i, i, comm, p],
        "ncclBroadcast": [p, p, sz, i, i, comm, p],
        "ncclAllGather": [p, p, sz, i, comm, p],
        "ncclSend": [p, sz, i, i, comm, p],
        "ncclRecv": [p, sz, i, i, comm, p],
        "ncclGroupStart": [],
        "ncclGroupEnd": [],
        "ncclGetVersion": [ctypes.POINTER(ctypes.c_int)],
    }
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    lib.ncclGetErrorString.argtypes, lib.ncclGetErrorString.restype = [ctypes.c_int], ctypes.c_char_p
    return lib


def available() -> bool:
    """True when libnccl.so.2 can be loaded (a GPU is still needed to use it)."""
    return _lib() is not None


def version() -> str | None:
    """The loaded library's version ("2.27.7"), or None when it does not load."""
    lib = _lib()
    if lib is None:
        return None
    v = ctypes.c_int()
    if lib.ncclGetVersion(ctypes.byref(v)) != 0:
        return None
    code = v.value  # NCCL_VERSION(X,Y,Z): X*10000+Y*100+Z since 2.9 (X*1000+Y*100+Z before)
    major, rest = (code // 10000, code % 10000) if code >= 20900 else (code // 1000, code % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def shared_gpus(places: list[tuple[str, str]]) -> list[tuple[int, ...]]:
    """Groups of ranks (indices into `places`, each rank's (host, GPU id)) that sit on one GPU. Pure."""
    by_place: dict = {}
    for rank, place in enumerate(places):
        by_place.setdefault(tuple(place), []).append(rank)
    return [tuple(ranks) for ranks in by_place.values() if len(ranks) > 1]


def gpu_operations(choice: str) -> str:
    """'nccl' or 'mpi' for CUDA tensors, given the settings' `choice` (horovod_env.Settings.gpu_operations:
    'nccl', 'mpi', or '' for nccl when the library loads). 'mpi' stages CUDA tensors through host memory.
    RuntimeError for 'nccl' where libnccl.so.2 does not load. (context.Session decides once per session.)"""
    if choice not in ("", "nccl", "mpi"):
        raise ValueError(f"GPU operations {choice!r}: use 'nccl' or 'mpi'")
    if choice == "nccl" and not available():
        raise RuntimeError("TRAINRUN_GPU_OPERATIONS=nccl but libnccl.so.2 was not found "
                           "(pip install nvidia-nccl-cu12, or set TRAINRUN_GPU_OPERATIONS=mpi)")
    return choice or ("nccl" if available() else "mpi")


class NcclPlane:
    """backends.Collectives for CUDA requests: the NCCL communicator is made (collectively, over
    `mpi_comm`) on the first response, on the device of its first tensor (not known before)."""

    def __init__(self, mpi_comm, rank: int, size: int):
        self._mpi_comm, self._rank, self._size = mpi_comm, rank, size
        self._nccl: NcclCollectives | None = None
        self.reductions = 0

    def execute(self, kind: str, names: list[str], reqs: list, info) -> list:
        nccl = self._nccl
        if nccl is None:
            some = next((r for r in reqs if r is not None), None)
            nccl = self._nccl = NcclCollectives(self._mpi_comm, self._rank, self._size,
                                                some.inp.device if some is not None else "cuda")
        if kind == "allreduce":
            self.reductions += 1
        return nccl.execute(kind, reqs, info)

    def close(self) -> None:
        if self._nccl is not None:
            self._nccl.close()
            self._nccl = None


class NcclCollectives:
    """NCCL communicator + stream for this rank; `execute(kind, reqs, info)` runs one CUDA response."""

    def __init__(self, mpi_comm, rank: int, size: int, device):
        """Collective (all ranks, same point of the agreed order). `device`: this rank's GPU (the
        tensors' device; CUDA's current device is per thread, so it is not taken from the caller)."""
        import torch

        lib = _lib()
        if lib is None:
            raise RuntimeError("a CUDA tensor needs NCCL, but libnccl.so.2 was not found")
        self.torch, self.lib, self.rank, self.size = torch, lib, rank, size
        self.device = torch.device(device)
        self._refuse_shared_gpus(mpi_comm)
        uid = _UniqueId()
        if rank == 0:
            self._check(lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        raw = mpi_comm.bcast(ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid)) if rank == 0 else None,
                             root=0)
        ctypes.memmove(ctypes.addressof(uid), raw, len(raw))
        self.comm = ctypes.c_void_p()
        with torch.cuda.device(self.device):
            self._check(lib.ncclCommInitRank(ctypes.byref(self.comm), size, uid, rank), "ncclCommInitRank")
            self.stream = torch.cuda.Stream(self.device)
        self._fusion: dict = {}

    def _refuse_shared_gpus(self, mpi_comm) -> None:
        """Collective. NCCL cannot put two ranks of a communicator on one GPU (ncclCommInitRank fails with
        "invalid usage"); say which ranks share which GPU and what to do instead, on every rank."""
        import socket

        props = self.torch.cuda.get_device_properties(self.device)
        gpu = str(getattr(props, "uuid", "") or self.device.index)
        places = mpi_comm.allgather((socket.gethostname(), gpu))
        shared = shared_gpus(places)
        if shared:
            ranks = shared[0]
            raise RuntimeError(
                f"ranks {', '.join(map(str, ranks))} use one GPU ({self.torch.cuda.get_device_name(self.device)} "
                f"on {places[ranks[0]][0]}), and NCCL needs a GPU of its own per rank: give each rank its own GPU "
                f"(torch.cuda.set_device(hvd.local_rank()) with as many GPUs as local ranks, or --gpus-per-proc 1), or "
                f"share GPUs through host memory with TRAINRUN_GPU_OPERATIONS=mpi (what --allow-gpu-sharing sets)")

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} failed: NCCL error {rc}: {self.lib.ncclGetErrorString(rc).decode()}")

    def close(self) -> None:
        self.lib.ncclCommDestroy(self.comm)

    # -- helpers --
    def _s(self):
        return ctypes.c_void_p(self.stream.cuda_stream)

    def _allreduce(self, send, recv, dtype: str, op: int) -> None:
        self._check(self.lib.ncclAllReduce(ctypes.c_void_p(send.data_ptr()), ctypes.c_void_p(recv.data_ptr()),
                                           recv.numel(), _DTYPES[dtype], _OPS[op], self.comm, self._s()),
                    "ncclAllReduce")

    def _scaled_copy(self, dst, src, scale: float) -> None:
        if scale == 1.0:
            dst.copy_(src)
        elif dst.dtype.is_floating_point:
            self.torch.mul(src, scale, out=dst)
        else:  # integers: scale in float64, truncate (as the CPU path)
            dst.copy_(src.to(self.torch.float64) * scale)

    def _buffer(self, dtype, count: int):
        buf = self._fusion.get(dtype)
        if buf is None or buf.numel() < count:
            buf = self._fusion[dtype] = self.torch.empty(max(count, 1024), dtype=dtype, device=self.device)
        return buf[:count]

    def _bytes(self, t):
        return t.reshape(-1).view(self.torch.uint8)

    # -- ops --
    def execute(self, kind: str, reqs: list, info) -> list:
        if kind == "allreduce" and len(reqs) == 1 and reqs[0] is not None:
            r = reqs[0]
            op, post = sum_then_scale(r.op, r.postscale, self.size)
            if r.prescale == 1.0 and post == 1.0:
                # the commonest op runs no torch kernel on the private stream: no device or stream switch
                # (their context managers cost tens of microseconds of Python per call)
                if r.ready is not None:
                    self.stream.wait_event(r.ready)
                self._allreduce(r.inp, r.out, r.dtype, op)
                self.stream.synchronize()
                return [r.out]
        torch = self.torch
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            for r in reqs:
                if r is not None and r.ready is not None:
                    self.stream.wait_event(r.ready)
            if kind == "allreduce":
                results = self.allreduce(reqs, info)
            elif kind == "allgather":
                results = [self.allgather(reqs[0], info)]
            elif kind == "broadcast":
                results = [self.broadcast(reqs[0])]
            elif kind == "alltoall":
                results = [self.alltoall(reqs[0], info)]
            elif kind == "reducescatter":
                results = [self.reducescatter(reqs[0])]
            else:
                raise ValueError(f"{kind} is not a GPU operation")
        self.stream.synchronize()
        return results

    def allreduce(self, reqs, joined_info) -> list:
        torch = self.torch
        some = next((r for r in reqs if r is not None), None)
        if some is not None:
            dtype, op, pre, post = some.dtype, some.op, some.prescale, some.postscale
            counts = [r.inp.numel() for r in reqs]
            tdtype = some.inp.dtype
        else:  # this rank has joined: zeros of the shapes in messages.JoinedInfo
            j = joined_info
            dtype, op, pre, post = j.dtype, j.op, j.prescale, j.postscale
            counts = [math.prod(s) for s in j.shapes]
            tdtype = getattr(torch, dtype)
        op, post = sum_then_scale(op, post, self.size)
        if len(reqs) == 1 and some is not None:
            send = some.inp
            if pre != 1.0:
                self._scaled_copy(some.out, some.inp, pre)
                send = some.out
            self._allreduce(send, some.out, dtype, op)
            if post != 1.0:
                self._scaled_copy(some.out, some.out, post)
            return [some.out]
        buf = self._buffer(tdtype, sum(counts))
        off = 0
        for r, c in zip(reqs, counts):
            if r is None:
                buf[off:off + c].zero_()
            else:
                self._scaled_copy(buf[off:off + c], r.inp, pre)
            off += c
        self._allreduce(buf, buf, dtype, op)
        off = 0
        for r, c in zip(reqs, counts):
            if r is not None:
                self._scaled_copy(r.out, buf[off:off + c], post)
            off += c
        return [None if r is None else r.out for r in reqs]

    def allgather(self, req, dim0s: list[int]):
        torch = self.torch
        row = math.prod(req.shape[1:]) * req.inp.element_size()
        longest = max(dim0s) * row
        send = self._bytes(req.inp)
        if any(d != dim0s[0] for d in dim0s):
            padded = torch.zeros(longest, dtype=torch.uint8, device=self.device)
            padded[:send.numel()] = send
            send = padded
        recv = torch.empty(longest * self.size, dtype=torch.uint8, device=self.device)
        self._check(self.lib.ncclAllGather(ctypes.c_void_p(send.data_ptr()), ctypes.c_void_p(recv.data_ptr()),
                                           longest, _UINT8, self.comm, self._s()), "ncclAllGather")
        parts = [recv[r * longest:r * longest + d * row] for r, d in enumerate(dim0s)]
        out = torch.cat(parts) if len(set(dim0s)) > 1 else recv
        return out.view(req.inp.dtype).reshape((sum(dim0s),) + tuple(req.shape[1:]))

    def broadcast(self, req):
        if self.rank == req.root and req.out is not req.inp:
            req.out.copy_(req.inp)
        buf = self._bytes(req.out)
        self._check(self.lib.ncclBroadcast(ctypes.c_void_p(buf.data_ptr()), ctypes.c_void_p(buf.data_ptr()),
                                           buf.numel(), _UINT8, req.root, self.comm, self._s()), "ncclBroadcast")
        return req.out

    def alltoall(self, req, splits: list):
        torch = self.torch
        row = math.prod(req.shape[1:]) * req.inp.element_size()
        recv_splits = [splits[r][self.rank] for r in range(self.size)]
        out = torch.empty((sum(recv_splits),) + tuple(req.shape[1:]), dtype=req.inp.dtype, device=self.device)
        send, recv = self._bytes(req.inp), self._bytes(out)
        s_off = r_off = 0
        self._check(self.lib.ncclGroupStart(), "ncclGroupStart")
        for peer in range(self.size):
            n_send, n_recv = splits[self.rank][peer] * row, recv_splits[peer] * row
            # empty parts are left out on both sides (each knows the whole split matrix)
            if n_send:
                self._check(self.lib.ncclSend(ctypes.c_void_p(send.data_ptr() + s_off), n_send, _UINT8, peer,
                                              self.comm, self._s()), "ncclSend")
            if n_recv:
                self._check(self.lib.ncclRecv(ctypes.c_void_p(recv.data_ptr() + r_off), n_recv, _UINT8, peer,
                                              self.comm, self._s()), "ncclRecv")
            s_off, r_off = s_off + n_send, r_off + n_recv
        self._check(self.lib.ncclGroupEnd(), "ncclGroupEnd")
        return out, torch.tensor(recv_splits, dtype=torch.int32)

    def reducescatter(self, req):
        full = self._buffer(req.inp.dtype, req.inp.numel())
        self._scaled_copy(full, req.inp, req.prescale)
        op, post = sum_then_scale(req.op, req.postscale, self.size)
        self._allreduce(full, full, req.dtype, op)
        row = math.prod(req.shape[1:])
        rows = split_rows(req.shape[0], self.size)
        start = sum(rows[:self.rank]) * row
        self._scaled_copy(req.out, full[start:start + rows[self.rank] * row], post)
        return req.out
