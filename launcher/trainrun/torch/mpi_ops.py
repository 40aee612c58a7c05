"""horovod.torch's collective ops on torch tensors, over the framework-free runtime: the public
functions. Tensors become engine Requests in builders.py (how CPU, CUDA and non-contiguous tensors
travel is described there); the differentiable ops' autograd Functions are in autograd.py.

Handles are ints (shared with trainrun.runtime's); `synchronize` returns the output tensor.
The blocking `allreduce`, `grouped_allreduce`, `allgather`, `grouped_allgather`, `broadcast`,
`alltoall`, `reducescatter` and `grouped_reducescatter` are differentiable, with Horovod's gradients.
"""
from __future__ import annotations


import numpy as np
import torch

from trainrun.runtime.ops import handle_average_backwards_compatibility
from trainrun.runtime import api, lifecycle, requests as rq
from trainrun.runtime.ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 (re-exported)
from trainrun.runtime.process_sets import global_process_set
from trainrun.torch import builders as build
from trainrun.torch.autograd import (HorovodAllgather, HorovodAllreduce, HorovodAlltoall, HorovodBroadcast,
                                     HorovodGroupedAllgather, HorovodGroupedAllreduce, HorovodGroupedReducescatter,
                                     HorovodReducescatter)
from trainrun.torch.compression import Compression


def _submit(builder, process_set, *args) -> int:
    eng = lifecycle.engine(process_set)
    return api.submit(builder(eng, *args), eng)


def _run(builder, process_set, *args):
    eng = lifecycle.engine(process_set)
    return api.run(builder(eng, *args), eng)


# ---- async API --------------------------------------------------------------------------
def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set) -> int:
    op = handle_average_backwards_compatibility(op, average)
    return _submit(build.allreduce, process_set, tensor, name, op, prescale_factor, postscale_factor, False)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set) -> int:
    op = handle_average_backwards_compatibility(op, average)
    return _submit(build.allreduce, process_set, tensor, name, op, prescale_factor, postscale_factor, True)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set) -> torch.Tensor:
    if op is None or average is not None:
        op = handle_average_backwards_compatibility(op, average)
    eng = lifecycle.engine(process_set)
    if build.plain(tensor) and op != Adasum:  # contiguous CPU: NumPy's fast path (api.allreduce_into)
        a, dtype = build.flat_view(tensor)
        api.allreduce_into(eng, None, a, tuple(tensor.shape), dtype, name, op, prescale_factor, postscale_factor)
        return tensor
    return api.run(build.allreduce(eng, tensor, name, op, prescale_factor, postscale_factor, True), eng)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> int:
    op = handle_average_backwards_compatibility(op, average)
    return _submit(build.grouped_allreduce, process_set, tensors, name, op, prescale_factor, postscale_factor, False)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set) -> int:
    op = handle_average_backwards_compatibility(op, average)
    return _submit(build.grouped_allreduce, process_set, tensors, name, op, prescale_factor, postscale_factor, True)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set) -> list:
    op = handle_average_backwards_compatibility(op, average)
    eng = lifecycle.engine(process_set)
    return api.run(build.grouped_allreduce(eng, tensors, name, op, prescale_factor, postscale_factor, True), eng)


def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    return _submit(build.allgather, process_set, tensor, name)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    return _submit(build.broadcast, process_set, tensor, root_rank, name, False)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    return _submit(build.broadcast, process_set, tensor, root_rank, name, True)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    return _run(build.broadcast, process_set, tensor, root_rank, name, True)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> int:
    return _submit(build.alltoall, process_set, tensor, splits, name)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> int:
    """Start allgather of each tensor, announced together; synchronize returns the list."""
    return _submit(build.grouped, process_set, build.allgather, "grouped_allgather", tensors, name)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> int:
    """Start reducescatter of each tensor, announced together; synchronize returns the list."""
    return _submit(build.grouped, process_set, build.reducescatter, "grouped_reducescatter", tensors, name,
                   _scatter_op(op), prescale_factor, postscale_factor)


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=global_process_set):
    """Start the allreduce of a sparse COO tensor as Horovod does: allgather of its indices and of
    its values (duplicates are not summed; Average divides the values by the set's size). Returns a
    handle that `synchronize` takes and that, as in Horovod, can also be called to wait for the result."""
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce_async supports op=Average or op=Sum only")
    return _SparseHandle(_submit(build.sparse_allreduce, process_set, tensor, name, op))


class _SparseHandle(int):
    """An int handle (poll/synchronize) that is also callable, as Horovod's sparse handle is."""

    def __call__(self):
        return lifecycle.synchronize(self)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Rows splits[r] of dim 0 go to rank r (equal parts when None); returns the output, plus the
    received splits when `splits` was given. Differentiable: the gradient is the reverse alltoall."""
    return HorovodAlltoall.apply(tensor, splits, name, lifecycle.engine(process_set))


def _scatter_op(op: int) -> int:
    """`op` for a reducescatter: Adasum is refused with the error type Horovod raises (RuntimeError)."""
    if op == Adasum:
        raise NotImplementedError("reducescatter does not support op=Adasum (as in Horovod); use Sum or Average")
    return rq.check_op(op)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0) -> int:
    _scatter_op(op)
    return _submit(build.reducescatter, process_set, tensor, name, op, prescale_factor, postscale_factor)


def poll(handle: int) -> bool:
    return lifecycle.poll(handle)


def synchronize(handle: int):
    return lifecycle.synchronize(handle)


def barrier(process_set=global_process_set) -> None:
    api.barrier(process_set)


def join(device=-1) -> int:
    """Stop contributing data: until every rank has joined, this rank adds zeros to the others'
    allreduces. Returns the rank that joined last. `device` is accepted for compatibility."""
    return api.join()


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set) -> torch.Tensor:
    """Reduce `tensor` over ranks (default Average); returns a new tensor. Differentiable."""
    if op is None or average is not None:
        op = handle_average_backwards_compatibility(op, average)
    eng = lifecycle.engine(process_set)
    if compression is Compression.none and build.plain(tensor) and op != Adasum \
            and not (tensor.requires_grad and torch.is_grad_enabled()):
        # nothing to differentiate: no autograd Function (its apply costs more than the op). The output
        # is NumPy-allocated: NumPy asks for huge pages on large arrays, torch does not, and a fresh
        # 16 MiB output then takes 1.3x longer to fill
        a, dtype = build.flat_view(tensor)
        out = np.empty_like(a)
        api.allreduce_into(eng, a, out, tuple(tensor.shape), dtype, name, op, prescale_factor, postscale_factor)
        return torch.from_numpy(out.reshape(tensor.shape))
    compressed, ctx = compression.compress(tensor)
    reduced = HorovodAllreduce.apply(compressed, op, name, prescale_factor, postscale_factor, eng)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set) -> list:
    """allreduce of a list in one fused reduction. Differentiable."""
    op = handle_average_backwards_compatibility(op, average)
    eng = lifecycle.engine(process_set)
    tensors = list(tensors)
    if compression is Compression.none and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        # nothing to differentiate: no autograd Function (outputs: views of one reduced tensor, flat.py)
        return api.run(build.grouped_allreduce(eng, tensors, name, op, prescale_factor, postscale_factor, False), eng)
    pairs = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedAllreduce.apply(op, name, prescale_factor, postscale_factor, eng,
                                            *[t for t, _ in pairs])
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, pairs)]


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Concatenate every rank's tensor along dim 0 (which may differ per rank). Differentiable."""
    return HorovodAllgather.apply(tensor, name, lifecycle.engine(process_set))


def broadcast(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """root_rank's tensor on every rank, as a new tensor. Differentiable."""
    return HorovodBroadcast.apply(tensor, root_rank, name, lifecycle.engine(process_set))


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0) -> torch.Tensor:
    """Reduce over ranks and keep this rank's slice of dim 0. Differentiable."""
    compressed, ctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, _scatter_op(op), prescale_factor, postscale_factor,
                                     lifecycle.engine(process_set))
    return compression.decompress(out, ctx)


def grouped_allgather(tensors, name=None, process_set=global_process_set) -> list:
    """allgather of each tensor, announced together. Differentiable."""
    return list(HorovodGroupedAllgather.apply(name, lifecycle.engine(process_set), *tensors))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0) -> list:
    """reducescatter of each tensor, announced together. Differentiable."""
    pairs = [compression.compress(t) for t in tensors]
    outs = HorovodGroupedReducescatter.apply(name, _scatter_op(op), prescale_factor, postscale_factor,
                                             lifecycle.engine(process_set), *[t for t, _ in pairs])
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(outs, pairs)]
