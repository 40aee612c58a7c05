"""Tensors to engine Requests: the op builders of trainrun.torch, each returning (Requests,
finalize) for api.submit / api.run on engine `eng` (finalize(results) makes what the op returns).

Tensors reach the engine as NumPy views of their storage (no copy for contiguous CPU tensors;
bfloat16 travels as its 16-bit pattern). Non-contiguous tensors are copied to a contiguous buffer
(and, for in-place ops, copied back when the op completes). A group of CPU tensors of one dtype
travels as one flat copy (flat.py). CUDA tensors stay on the GPU and are
reduced with NCCL (runtime/backends/nccl.py) when libnccl.so.2 loads; with
TRAINRUN_GPU_OPERATIONS=mpi (or no NCCL) they are staged through host memory.
"""
from __future__ import annotations

import numpy as np
import torch

from trainrun.runtime import adasum, api, lifecycle, requests as rq
from trainrun.runtime.fusion import dtype_name
from trainrun.runtime.ops import Adasum, Average, split_rows
from trainrun.torch import flat


# ---- tensor <-> engine buffers ------------------------------------------------------------
def plain(t) -> bool:
    """A contiguous CPU tensor whose storage NumPy can view as its own dtype (not bfloat16)."""
    return t.__class__ is torch.Tensor and t.is_cpu and t.dtype is not torch.bfloat16 and t.is_contiguous()


def _numpy_dtypes() -> dict:
    """torch dtype -> (NumPy dtype, logical dtype name) for the dtypes NumPy can hold."""
    out = {}
    for d in (torch.float16, torch.float32, torch.float64, torch.uint8, torch.int8, torch.int16, torch.int32,
              torch.int64, torch.bool):
        nd = torch.empty(0, dtype=d).numpy().dtype
        out[d] = (nd, dtype_name(nd))
    return out


_NUMPY_DTYPES = _numpy_dtypes()  # a constant table (torch's and NumPy's dtypes do not change)
# mpi4py's MPI.buffer.fromaddress, bound at first use (importing mpi4py.MPI starts MPI): process-wide, not
# session state -- a function of the mpi4py module, the same for every session
_from_address = None


def flat_view(t: torch.Tensor):
    """(a flat NumPy array over a plain tensor's memory (`plain`), its logical dtype name).

    Made from the address (0.4 us) rather than by Tensor.numpy() (1 us with its release): the array
    does not keep the tensor alive, so it may only be used while something else holds the tensor (a
    blocking op's caller; an async op's handle until it is synchronized)."""
    global _from_address
    nd, name = _NUMPY_DTYPES.get(t.dtype) or (None, None)
    n = t.nbytes
    if nd is None or not n:  # (a dtype not listed above; an empty tensor has no address)
        a = t.detach().numpy()
        return a.reshape(-1), dtype_name(a.dtype)
    if _from_address is None:
        from mpi4py import MPI
        _from_address = MPI.buffer.fromaddress
    return np.frombuffer(_from_address(t.data_ptr(), n), nd), name


def _nccl(t: torch.Tensor) -> bool:
    """Whether `t` is reduced on its GPU with NCCL (else it is staged through host memory): the session's
    choice (lifecycle.gpu_operations, decided at its first CUDA op from TRAINRUN_GPU_OPERATIONS' setting)."""
    return t.is_cuda and lifecycle.gpu_operations() == "nccl"


def _view(t: torch.Tensor):
    """(flat buffer, logical dtype name) for the engine: a NumPy view of a contiguous CPU tensor's
    storage, or the flat CUDA tensor itself on the NCCL path."""
    if t.requires_grad:
        t = t.detach()
    if t.is_cuda:
        return t.reshape(-1), str(t.dtype).replace("torch.", "")
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().reshape(-1).view(np.uint16), "bfloat16"
    a = t.numpy().reshape(-1)
    return a, dtype_name(a.dtype)


def _placed(req, buf: torch.Tensor):
    """Mark a request built on `buf` as a GPU one when `buf` is on the GPU (NCCL path)."""
    if buf.is_cuda:
        req.device = "cuda"
        req.ready = torch.cuda.Event()
        req.ready.record()  # after the producer's kernels on the current stream
    return req


def _tensor(a, dtype: str) -> torch.Tensor:
    """Tensor of an engine-allocated result (NumPy memory shared; CUDA results are tensors already)."""
    if isinstance(a, torch.Tensor):
        return a
    if dtype == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _host(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor with t's data the engine can work on: t itself when possible; a host copy
    in pinned memory for CUDA tensors without NCCL (torch's caching host allocator reuses it: a fresh
    pageable copy faulted its pages in on every call, 4-5x slower at 16 MiB on an H100 host)."""
    if t.is_cuda and not _nccl(t):
        buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        buf.copy_(t.detach())
        return buf
    return t if t.is_contiguous() else t.contiguous()


def _empty(buf: torch.Tensor, like: torch.Tensor, shape=None) -> torch.Tensor:
    """An uninitialized output for work on `buf`: on `buf`'s device, pinned when `buf` stages the CUDA
    tensor `like` through host memory (so the copy back to the GPU is a fast one)."""
    shape = buf.shape if shape is None else shape
    if like.is_cuda and not buf.is_cuda:
        return torch.empty(shape, dtype=buf.dtype, pin_memory=True)
    return torch.empty(shape, dtype=buf.dtype, device=buf.device)


def _to_device(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return result if result.device == like.device else result.to(like.device)


def _in_place(t: torch.Tensor):
    """Buffer for in-place work on `t`, and the function that returns `t` with the result in it."""
    buf = _host(t)
    if buf is t:
        return buf, lambda: t

    def write_back():
        with torch.no_grad():
            t.copy_(buf)
        return t
    return buf, write_back


# ---- op builders ---------------------------------------------------------------------------
def allreduce(eng, tensor, name, op, prescale_factor, postscale_factor, in_place):
    if op == Adasum:
        return _adasum(eng, tensor, name, prescale_factor, postscale_factor, in_place)
    if in_place and plain(tensor):  # (finalize holds the tensor, as the address view needs)
        inp, dtype = flat_view(tensor)
        req = rq.allreduce(inp, inp, tuple(tensor.shape), dtype, rq.auto_name("allreduce", name, eng.set_id), op,
                           prescale_factor, postscale_factor)
        return [req], lambda _: tensor
    if in_place:
        buf, done = _in_place(tensor)
        out = buf
    else:
        buf = _host(tensor)
        out = torch.empty_like(buf) if buf is tensor else _empty(buf, tensor)
    inp, dtype = _view(buf)
    req = rq.allreduce(inp, inp if in_place else _view(out)[0], buf.shape, dtype,
                       rq.auto_name("allreduce", name, eng.set_id), op, prescale_factor, postscale_factor)
    return [_placed(req, buf)], ((lambda _: done()) if in_place else (lambda _: _to_device(out, tensor)))


def grouped_allreduce(eng, tensors, name, op, prescale_factor, postscale_factor, in_place, out=None):
    """CPU tensors of one dtype travel as one flat tensor (flat.py: one copy in, one request, one copy
    out or views of it; `out`: a buffer to reuse for it, flat.pack); anything else as one request per
    tensor, announced together."""
    base = rq.auto_name("grouped_allreduce", name, eng.set_id)
    tensors = list(tensors)
    packed = flat.pack(tensors, in_place, out)
    if packed is not None:
        buf, dtype = _view(packed.flat)
        req = rq.allreduce(buf, buf, buf.shape, dtype, base, op, prescale_factor, postscale_factor)
        return [req], (lambda _: packed.unpack()) if in_place else (lambda _: packed.views())
    reqs, finals = [], []
    for i, t in enumerate(tensors):
        (req,), fin = allreduce(eng, t, f"{base}.{i}", op, prescale_factor, postscale_factor, in_place)
        reqs.append(req)
        finals.append(fin)
    return reqs, lambda res: [f(None) for f in finals]


def allgather(eng, tensor, name):
    buf = _host(tensor)
    inp, dtype = _view(buf)
    req = rq.allgather(inp, buf.shape, dtype, rq.auto_name("allgather", name, eng.set_id))
    return [_placed(req, buf)], lambda res: _to_device(_tensor(res[0], dtype), tensor)


def broadcast(eng, tensor, root_rank, name, in_place):
    root = api.root_in(eng, root_rank)
    if in_place:
        buf, done = _in_place(tensor)
    else:
        src = _host(tensor)
        if eng.rank == root:  # (a staged or contiguous copy is the output's own already)
            buf = src.clone() if src is tensor else src
        else:
            buf = _empty(src, tensor)
    flat, dtype = _view(buf)
    req = rq.broadcast(flat, flat, buf.shape, dtype, rq.auto_name("broadcast", name, eng.set_id), root, eng.size)
    return [_placed(req, buf)], ((lambda _: done()) if in_place else (lambda _: _to_device(buf, tensor)))


def alltoall(eng, tensor, splits, name, both=False):
    """Result: the output, plus the received splits when `splits` was given (or `both`)."""
    buf = _host(tensor)
    inp, dtype = _view(buf)
    if isinstance(splits, torch.Tensor):
        splits = splits.cpu().numpy()
    req = rq.alltoall(inp, buf.shape, dtype, rq.auto_name("alltoall", name, eng.set_id), splits, eng.size)

    def finalize(res):
        out, received = res[0]
        out = _to_device(_tensor(out, dtype), tensor)
        return out if splits is None and not both else (out, torch.as_tensor(received))
    return [_placed(req, buf)], finalize


def reducescatter(eng, tensor, name, op, prescale_factor, postscale_factor):
    buf = _host(tensor)
    rq.check_dim("reducescatter", tuple(buf.shape))
    rows = split_rows(buf.shape[0], eng.size)[eng.rank]
    out = _empty(buf, tensor, (rows,) + tuple(buf.shape[1:]))
    inp, dtype = _view(buf)
    req = rq.reducescatter(inp, _view(out)[0], buf.shape, dtype, rq.auto_name("reducescatter", name, eng.set_id),
                           op, prescale_factor, postscale_factor)
    return [_placed(req, buf)], lambda _: _to_device(out, tensor)


def grouped(eng, builder, kind, tensors, name, *args):
    """`builder` (allgather, reducescatter) of each tensor as requests `<name>.<i>`, announced
    together under one handle; the result is the list of outputs."""
    base = rq.auto_name(kind, name, eng.set_id)
    reqs, finals = [], []
    for i, t in enumerate(tensors):
        (req,), fin = builder(eng, t, f"{base}.{i}", *args)
        reqs.append(req)
        finals.append(fin)
    return reqs, lambda res: [f([r]) for f, r in zip(finals, res)]


def sparse_allreduce(eng, tensor, name, op):
    """A sparse COO tensor's allreduce as Horovod's: allgather of its indices (transposed, so rows
    concatenate) and of its values, rebuilt as an (uncoalesced) sparse tensor of the same size."""
    if not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async needs a sparse COO tensor (tensor.is_sparse)")
    base = rq.auto_name("sparse_allreduce", name, eng.set_id)
    t = tensor.detach()
    (ireq,), ifin = allgather(eng, t._indices().t().contiguous(), f"{base}.indices")
    (vreq,), vfin = allgather(eng, t._values().contiguous(), f"{base}.values")

    def finalize(res):
        indices, values = ifin([res[0]]), vfin([res[1]])
        if op == Average:
            values = values / eng.size
        return torch.sparse_coo_tensor(indices.t(), values, t.size(), check_invariants=False)
    return [ireq, vreq], finalize


def _adasum(eng, tensor, name, prescale_factor, postscale_factor, in_place):
    """op=Adasum on host memory (runtime/adasum.py): an allgather, combined on every rank."""
    if tensor.dtype == torch.bfloat16:
        raise ValueError("op=Adasum needs a float16, float32 or float64 tensor, not bfloat16")
    buf = tensor.detach().to("cpu").contiguous() if tensor.is_cuda else _host(tensor)
    out = buf if in_place and buf is tensor else torch.empty_like(buf)
    inp, dtype = _view(buf)
    adasum.check_dtype(dtype)
    req = rq.allgather(inp, (1, inp.size), dtype, rq.auto_name("adasum", name, eng.set_id))

    def finalize(res):
        adasum.finish(res[0], eng.size, prescale_factor, postscale_factor, _view(out)[0])
        if in_place and out is not tensor:
            with torch.no_grad():
                tensor.copy_(out)
            return tensor
        return _to_device(out, tensor)
    return [req], finalize
