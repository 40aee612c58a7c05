"""horovod.torch's collective ops on torch tensors, over the framework-free runtime.

Tensors reach the engine as NumPy views of their storage (no copy for contiguous CPU tensors;
bfloat16 travels as its 16-bit pattern). Non-contiguous tensors are copied to a contiguous buffer
(and, for in-place ops, copied back when the op completes). CUDA tensors stay on the GPU and are
reduced with NCCL (runtime/backends/nccl.py) when libnccl.so.2 loads; with
TRAINRUN_GPU_OPERATIONS=mpi (or no NCCL) they are staged through host memory.

Handles are ints (shared with trainrun.runtime's); `synchronize` returns the output tensor.
The blocking `allreduce`, `grouped_allreduce`, `allgather`, `broadcast` and `reducescatter` are
differentiable, with Horovod's gradients.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from trainrun.runtime import api, requests as rq, state
from trainrun.runtime.backends import nccl
from trainrun.runtime.fusion import dtype_name
from trainrun.runtime.ops import Adasum, Average, Max, Min, Product, Sum, split_rows  # noqa: F401 (re-exported)
from trainrun.runtime.process_sets import global_process_set
from trainrun.torch.compression import Compression


def handle_average_backwards_compatibility(op, average):
    """Horovod's rule: `op` wins, `average` is deprecated, the default is Average."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning)
        return Average if average else Sum
    return Average


# ---- tensor <-> engine buffers ------------------------------------------------------------
def _nccl(t: torch.Tensor) -> bool:
    """Whether `t` is reduced on its GPU with NCCL (else it is staged through host memory)."""
    return t.is_cuda and nccl.gpu_operations() == "nccl"


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
    for CUDA tensors without NCCL."""
    if t.is_cuda and not _nccl(t):
        return t.detach().to("cpu").contiguous()
    return t if t.is_contiguous() else t.contiguous()


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


# ---- op builders: (Requests, finalize) for api.submit / api.run on engine `eng` ---------------
def _allreduce(eng, tensor, name, op, prescale_factor, postscale_factor, in_place):
    if in_place:
        buf, done = _in_place(tensor)
        out = buf
    else:
        buf = _host(tensor)
        out = torch.empty_like(buf)
    inp, dtype = _view(buf)
    req = rq.allreduce(inp, inp if in_place else _view(out)[0], buf.shape, dtype,
                       rq.auto_name("allreduce", name, eng.set_id), op, prescale_factor, postscale_factor)
    return [_placed(req, buf)], ((lambda _: done()) if in_place else (lambda _: _to_device(out, tensor)))


def _grouped_allreduce(eng, tensors, name, op, prescale_factor, postscale_factor, in_place):
    """CPU tensors of one dtype travel as one group (one negotiation entry, one reduction: see
    ops.Request); anything else as one request per tensor, announced together."""
    base = rq.auto_name("grouped_allreduce", name, eng.set_id)
    tensors = list(tensors)
    if tensors and len({t.dtype for t in tensors}) == 1 and not any(t.is_cuda for t in tensors):
        bufs, dones = [], []
        for t in tensors:
            if in_place:
                buf, done = _in_place(t)
                dones.append(done)
            else:
                buf = _host(t)
            bufs.append(buf)
        pairs = [_view(b) for b in bufs]
        views, dtype = [v for v, _ in pairs], pairs[0][1]
        shapes = tuple(tuple(b.shape) for b in bufs)
        if in_place:
            req = rq.group(views, views, shapes, dtype, base, op, prescale_factor, postscale_factor)
            return [req], lambda _: [d() for d in dones]
        fused = torch.empty(sum(b.numel() for b in bufs), dtype=bufs[0].dtype)
        outs = [o.view(shape) for o, shape in zip(fused.split([b.numel() for b in bufs]), shapes)]
        flat = _view(fused)[0]
        np_outs, off = [], 0
        for v in views:
            np_outs.append(flat[off:off + v.size])
            off += v.size
        req = rq.group(views, np_outs, shapes, dtype, base, op, prescale_factor, postscale_factor, flat)
        return [req], lambda _: outs
    reqs, finals = [], []
    for i, t in enumerate(tensors):
        (req,), fin = _allreduce(eng, t, f"{base}.{i}", op, prescale_factor, postscale_factor, in_place)
        reqs.append(req)
        finals.append(fin)
    return reqs, lambda res: [f(None) for f in finals]


def _allgather(eng, tensor, name):
    buf = _host(tensor)
    inp, dtype = _view(buf)
    req = rq.allgather(inp, buf.shape, dtype, rq.auto_name("allgather", name, eng.set_id))
    return [_placed(req, buf)], lambda res: _to_device(_tensor(res[0], dtype), tensor)


def _broadcast(eng, tensor, root_rank, name, in_place):
    root = api.root_in(eng, root_rank)
    if in_place:
        buf, done = _in_place(tensor)
    else:
        src = _host(tensor)
        buf = src.clone() if eng.rank == root else torch.empty_like(src)
    flat, dtype = _view(buf)
    req = rq.broadcast(flat, flat, buf.shape, dtype, rq.auto_name("broadcast", name, eng.set_id), root, eng.size)
    return [_placed(req, buf)], ((lambda _: done()) if in_place else (lambda _: _to_device(buf, tensor)))


def _alltoall(eng, tensor, splits, name):
    buf = _host(tensor)
    inp, dtype = _view(buf)
    if isinstance(splits, torch.Tensor):
        splits = splits.cpu().numpy()
    req = rq.alltoall(inp, buf.shape, dtype, rq.auto_name("alltoall", name, eng.set_id), splits, eng.size)

    def finalize(res):
        out, received = res[0]
        out = _to_device(_tensor(out, dtype), tensor)
        return out if splits is None else (out, torch.as_tensor(received))
    return [_placed(req, buf)], finalize


def _reducescatter(eng, tensor, name, op, prescale_factor, postscale_factor):
    buf = _host(tensor)
    rq.check_dim("reducescatter", tuple(buf.shape))
    rows = split_rows(buf.shape[0], eng.size)[eng.rank]
    out = torch.empty((rows,) + tuple(buf.shape[1:]), dtype=buf.dtype, device=buf.device)
    inp, dtype = _view(buf)
    req = rq.reducescatter(inp, _view(out)[0], buf.shape, dtype, rq.auto_name("reducescatter", name, eng.set_id),
                           op, prescale_factor, postscale_factor)
    return [_placed(req, buf)], lambda _: _to_device(out, tensor)


def _submit(builder, process_set, *args) -> int:
    eng = state.engine(process_set)
    return api.submit(builder(eng, *args), eng)


def _run(builder, process_set, *args):
    eng = state.engine(process_set)
    return api.run(builder(eng, *args), eng)


# ---- async API --------------------------------------------------------------------------
def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set) -> int:
    op = handle_average_backwards_compatibility(op, average)
    return _submit(_allreduce, process_set, tensor, name, op, prescale_factor, postscale_factor, False)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set) -> int:
    op = handle_average_backwards_compatibility(op, average)
    eng = state.engine(process_set)
    if tensor.__class__ is torch.Tensor and tensor.is_cpu and not tensor.requires_grad \
            and tensor.dtype is not torch.bfloat16 and tensor.is_contiguous():
        # a gradient (DistributedOptimizer's hooks: one per parameter per step), in fewer steps
        a = tensor.numpy()
        if a.ndim != 1:
            a = a.reshape(-1)
        req = rq.allreduce(a, a, tuple(tensor.shape), dtype_name(a.dtype),
                           name if name.__class__ is str else rq.auto_name("allreduce", name, eng.set_id),
                           op, prescale_factor, postscale_factor)
        eng.submit([req])
        return state.add_handle([req.handle], lambda _: tensor, eng)
    return api.submit(_allreduce(eng, tensor, name, op, prescale_factor, postscale_factor, True), eng)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set) -> torch.Tensor:
    op = handle_average_backwards_compatibility(op, average)
    return _run(_allreduce, process_set, tensor, name, op, prescale_factor, postscale_factor, True)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> int:
    op = handle_average_backwards_compatibility(op, average)
    return _submit(_grouped_allreduce, process_set, tensors, name, op, prescale_factor, postscale_factor, False)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set) -> int:
    op = handle_average_backwards_compatibility(op, average)
    return _submit(_grouped_allreduce, process_set, tensors, name, op, prescale_factor, postscale_factor, True)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set) -> list:
    op = handle_average_backwards_compatibility(op, average)
    return _run(_grouped_allreduce, process_set, tensors, name, op, prescale_factor, postscale_factor, True)


def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    return _submit(_allgather, process_set, tensor, name)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    return _submit(_broadcast, process_set, tensor, root_rank, name, False)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    return _submit(_broadcast, process_set, tensor, root_rank, name, True)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    return _run(_broadcast, process_set, tensor, root_rank, name, True)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> int:
    return _submit(_alltoall, process_set, tensor, splits, name)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Rows splits[r] of dim 0 go to rank r (equal parts when None); returns the output, plus the
    received splits when `splits` was given. Not differentiable."""
    return _run(_alltoall, process_set, tensor, splits, name)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0) -> int:
    return _submit(_reducescatter, process_set, tensor, name, op, prescale_factor, postscale_factor)


def poll(handle: int) -> bool:
    return state.poll(handle)


def synchronize(handle: int):
    return state.synchronize(handle)


def barrier(process_set=global_process_set) -> None:
    api.barrier(process_set)


def join(device=-1) -> int:
    """Stop contributing data: until every rank has joined, this rank adds zeros to the others'
    allreduces. Returns the rank that joined last. `device` is accepted for compatibility."""
    return api.join()


# ---- differentiable blocking ops (the engine travels in ctx: backward runs on the same set) ------
class HorovodAllreduce(torch.autograd.Function):
    """Gradient of an allreduce is the same allreduce of the gradient."""

    @staticmethod
    def forward(ctx, tensor, op, name, prescale_factor, postscale_factor, eng):
        ctx.op, ctx.prescale_factor, ctx.postscale_factor, ctx.eng = op, prescale_factor, postscale_factor, eng
        return api.run(_allreduce(eng, tensor, name, op, prescale_factor, postscale_factor, False), eng)

    @staticmethod
    def backward(ctx, grad_output):
        eng = ctx.eng
        grad = api.run(_allreduce(eng, grad_output.contiguous(), None, ctx.op, ctx.prescale_factor,
                                  ctx.postscale_factor, False), eng)
        return grad, None, None, None, None, None


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, name, prescale_factor, postscale_factor, eng, *tensors):
        ctx.op, ctx.prescale_factor, ctx.postscale_factor, ctx.eng = op, prescale_factor, postscale_factor, eng
        return tuple(api.run(_grouped_allreduce(eng, tensors, name, op, prescale_factor, postscale_factor, False),
                             eng))

    @staticmethod
    def backward(ctx, *grads):
        eng = ctx.eng
        reduced = api.run(_grouped_allreduce(eng, [g.contiguous() for g in grads], None, ctx.op,
                                             ctx.prescale_factor, ctx.postscale_factor, False), eng)
        return (None, None, None, None, None, *reduced)


class HorovodAllgather(torch.autograd.Function):
    """Gradient: average the gradient over ranks, keep this rank's rows."""

    @staticmethod
    def forward(ctx, tensor, name, eng):
        ctx.dim, ctx.eng = tensor.shape[0], eng
        return api.run(_allgather(eng, tensor, name), eng)

    @staticmethod
    def backward(ctx, grad_output):
        eng = ctx.eng
        grad = api.run(_allreduce(eng, grad_output.contiguous(), None, Average, 1.0, 1.0, False), eng)
        dims = api.run(_allgather(eng, torch.tensor([ctx.dim], dtype=torch.int64), None), eng)
        offset = int(dims[:eng.rank].sum())
        return grad.narrow(0, offset, ctx.dim), None, None


class HorovodBroadcast(torch.autograd.Function):
    """Gradient: the average gradient on the root, zero elsewhere."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, eng):
        ctx.root, ctx.eng = api.root_in(eng, root_rank), eng
        return api.run(_broadcast(eng, tensor, root_rank, name, False), eng)

    @staticmethod
    def backward(ctx, grad_output):
        eng = ctx.eng
        grad = api.run(_allreduce(eng, grad_output.contiguous(), None, Average, 1.0, 1.0, False), eng)
        if eng.rank != ctx.root:
            grad = grad * 0
        return grad, None, None, None


class HorovodReducescatter(torch.autograd.Function):
    """Gradient: gather the slices' gradients (divided by size for Average)."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, eng):
        ctx.op, ctx.eng = op, eng
        return api.run(_reducescatter(eng, tensor, name, op, prescale_factor, postscale_factor), eng)

    @staticmethod
    def backward(ctx, grad_output):
        eng = ctx.eng
        grad = api.run(_allgather(eng, grad_output.contiguous(), None), eng)
        if ctx.op == Average:
            grad = grad / eng.size
        return grad, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set) -> torch.Tensor:
    """Reduce `tensor` over ranks (default Average); returns a new tensor. Differentiable."""
    op = handle_average_backwards_compatibility(op, average)
    eng = state.engine(process_set)
    compressed, ctx = compression.compress(tensor)
    reduced = HorovodAllreduce.apply(compressed, op, name, prescale_factor, postscale_factor, eng)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set) -> list:
    """allreduce of a list in one fused reduction. Differentiable."""
    op = handle_average_backwards_compatibility(op, average)
    eng = state.engine(process_set)
    pairs = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedAllreduce.apply(op, name, prescale_factor, postscale_factor, eng,
                                            *[t for t, _ in pairs])
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, pairs)]


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Concatenate every rank's tensor along dim 0 (which may differ per rank). Differentiable."""
    return HorovodAllgather.apply(tensor, name, state.engine(process_set))


def broadcast(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """root_rank's tensor on every rank, as a new tensor. Differentiable."""
    return HorovodBroadcast.apply(tensor, root_rank, name, state.engine(process_set))


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0) -> torch.Tensor:
    """Reduce over ranks and keep this rank's slice of dim 0. Differentiable."""
    compressed, ctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, rq.check_op(op), prescale_factor, postscale_factor,
                                     state.engine(process_set))
    return compression.decompress(out, ctx)
