"""The framework-free API on NumPy arrays (`import trainrun.runtime as hvd`).

Same names and semantics as horovod.torch, with NumPy arrays in place of tensors: `*_async` return
int handles for `poll`/`synchronize`; trailing-underscore variants work in place; ops are Average
(default), Sum, Min, Max, Product. Inputs need not be contiguous (a contiguous copy is made then).
"""
from __future__ import annotations

import pickle
from operator import attrgetter

import numpy as np

from trainrun.runtime import requests as rq
from trainrun.runtime import state
from trainrun.runtime.collectives import split_rows
from trainrun.runtime.fusion import OutputPool, dtype_name
from trainrun.runtime.ops import Average


_outputs = OutputPool()
_DTYPE, _SHAPE, _SIZE = attrgetter("dtype"), attrgetter("shape"), attrgetter("size")


def submit(op) -> int:
    """Start `op` = (Requests, finalize) and return its handle; `finalize(results)` makes what
    synchronize returns."""
    reqs, finalize = op
    state.engine().submit(reqs)
    return state.add_handle([r.handle for r in reqs], finalize)


def run(op):
    """Run `op` = (Requests, finalize) to completion in the calling thread (no hand-off to the engine's)."""
    reqs, finalize = op
    return finalize(state.engine().run(reqs))


def _contiguous(tensor) -> np.ndarray:
    """C-contiguous array with tensor's data (tensor itself when it already is; 0-d stays 0-d)."""
    return np.asarray(tensor, order="C")


def _in_place(tensor: np.ndarray):
    """A contiguous buffer for in-place work on `tensor` and a function writing it back if it is a copy."""
    if not isinstance(tensor, np.ndarray) or not tensor.flags.writeable:
        raise ValueError("in-place operations need a writeable numpy.ndarray")
    if tensor.flags.c_contiguous:
        return tensor, lambda: tensor
    buf = np.ascontiguousarray(tensor)

    def write_back():
        tensor[...] = buf
        return tensor
    return buf, write_back


def _allreduce(tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0):
    a = _contiguous(tensor)
    out = np.empty_like(a)
    req = rq.allreduce(a.reshape(-1), out.reshape(-1), a.shape, dtype_name(a.dtype),
                       rq.auto_name("allreduce", name), op, prescale_factor, postscale_factor)
    return [req], (lambda _: out)


def allreduce(tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0) -> np.ndarray:
    """op over ranks of (tensor * prescale_factor), times postscale_factor; a new array."""
    return run(_allreduce(tensor, name, op, prescale_factor, postscale_factor))


def _allreduce_(tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0):
    if tensor.__class__ is np.ndarray and tensor.flags.c_contiguous and tensor.flags.writeable:
        buf, finalize = tensor, (lambda _: tensor)  # the usual case: no copy, nothing to write back
    else:
        buf, done = _in_place(tensor)
        finalize = lambda _: done()  # noqa: E731
    flat = buf.reshape(-1)
    req = rq.allreduce(flat, flat, buf.shape, dtype_name(buf.dtype), rq.auto_name("allreduce", name),
                       op, prescale_factor, postscale_factor)
    return [req], finalize


def allreduce_(tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0) -> np.ndarray:
    """allreduce into `tensor` itself (returned)."""
    if tensor.__class__ is np.ndarray:
        flags = tensor.flags
        if flags.c_contiguous and flags.writeable:  # the usual case, in few steps (Engine.allreduce_now)
            flat, shape, dtype = tensor.reshape(-1), tensor.shape, dtype_name(tensor.dtype)
            name = name if name.__class__ is str else rq.auto_name("allreduce", name)
            engine = state.engine()
            if prescale_factor == 1.0 and engine.allreduce_now(None, flat, shape, dtype, name, op,
                                                               float(postscale_factor)):
                return tensor
            engine.run([rq.allreduce(flat, flat, shape, dtype, name, op, prescale_factor, postscale_factor)])
            return tensor
    return run(_allreduce_(tensor, name, op, prescale_factor, postscale_factor))


def _grouped_allreduce(tensors, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0):
    """One handle for a list, negotiated as one entry and reduced in one call. With one dtype the
    outputs are views of one fused buffer, so nothing is unpacked after the reduction (the per-tensor
    Python work is kept to a minimum: it dominates for many small tensors)."""
    base = rq.auto_name("grouped_allreduce", name)
    arrays = list(map(np.asarray, tensors))
    dtypes = list(map(_DTYPE, arrays))
    same_dtype = bool(dtypes) and dtypes.count(dtypes[0]) == len(dtypes)  # (count compares by identity first)
    if not same_dtype:  # mixed dtypes (or none): one request per tensor, announced together
        arrays = [_contiguous(a) for a in arrays]
        outs = [np.empty_like(a) for a in arrays]
        reqs = [rq.allreduce(a.reshape(-1), o.reshape(-1), a.shape, dtype_name(a.dtype), f"{base}.{i}",
                             op, prescale_factor, postscale_factor)
                for i, (a, o) in enumerate(zip(arrays, outs))]
        return reqs, (lambda _: outs)
    shapes = tuple(map(_SHAPE, arrays))
    if shapes.count(shapes[0]) == len(shapes):  # all alike: the views come from one reshape, in C
        fused = _outputs.get(arrays[0].dtype, len(arrays) * arrays[0].size)
        outs = list(fused.reshape((len(arrays),) + shapes[0]))
    else:
        sizes = list(map(_SIZE, arrays))
        fused = _outputs.get(arrays[0].dtype, sum(sizes))
        outs, off = [], 0
        for shape, n in zip(shapes, sizes):
            outs.append(fused[off:off + n].reshape(shape))
            off += n
    req = rq.group(arrays, outs, shapes, dtype_name(arrays[0].dtype), base, op, prescale_factor,
                   postscale_factor, fused)
    return [req], (lambda _: outs)


def grouped_allreduce(tensors, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0) -> list:
    return run(_grouped_allreduce(tensors, name, op, prescale_factor, postscale_factor))


def _allgather(tensor, name=None):
    """Concatenation along dim 0 of every rank's tensor; dim 0 may differ between ranks."""
    a = _contiguous(tensor)
    req = rq.allgather(a.reshape(-1), a.shape, dtype_name(a.dtype), rq.auto_name("allgather", name))
    return [req], (lambda res: res[0])


def allgather(tensor, name=None) -> np.ndarray:
    return run(_allgather(tensor, name))


def _broadcast(tensor, root_rank, name=None):
    a = _contiguous(tensor)
    out = a.copy() if state.rank() == root_rank else np.empty_like(a)
    flat = out.reshape(-1)
    req = rq.broadcast(flat, flat, a.shape, dtype_name(a.dtype), rq.auto_name("broadcast", name), root_rank)
    return [req], (lambda _: out)


def broadcast(tensor, root_rank, name=None) -> np.ndarray:
    """root_rank's tensor, as a new array on every rank (shapes and dtypes must match)."""
    return run(_broadcast(tensor, root_rank, name))


def _broadcast_(tensor, root_rank, name=None):
    buf, done = _in_place(tensor)
    flat = buf.reshape(-1)
    req = rq.broadcast(flat, flat, buf.shape, dtype_name(buf.dtype), rq.auto_name("broadcast", name), root_rank)
    return [req], (lambda _: done())


def broadcast_(tensor, root_rank, name=None) -> np.ndarray:
    return run(_broadcast_(tensor, root_rank, name))


def _alltoall(tensor, splits=None, name=None):
    """Rows splits[r] of dim 0 go to rank r (equal parts when None). Result: output, plus the
    received splits when `splits` was given (as Horovod)."""
    a = _contiguous(tensor)
    req = rq.alltoall(a.reshape(-1), a.shape, dtype_name(a.dtype), rq.auto_name("alltoall", name), splits)
    return [req], ((lambda res: res[0][0]) if splits is None else (lambda res: res[0]))


def alltoall(tensor, splits=None, name=None):
    return run(_alltoall(tensor, splits, name))


def _reducescatter(tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0):
    """Reduce over ranks, then rank r keeps its slice of dim 0 (the first dim0 % size ranks get a row more)."""
    a = _contiguous(tensor)
    rq.check_dim("reducescatter", a.shape)
    rows = split_rows(a.shape[0], state.size())[state.rank()]
    out = np.empty((rows,) + a.shape[1:], dtype=a.dtype)
    req = rq.reducescatter(a.reshape(-1), out.reshape(-1), a.shape, dtype_name(a.dtype),
                           rq.auto_name("reducescatter", name), op, prescale_factor, postscale_factor)
    return [req], (lambda _: out)


def reducescatter(tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0) -> np.ndarray:
    return run(_reducescatter(tensor, name, op, prescale_factor, postscale_factor))


def barrier() -> None:
    run(([rq.barrier(rq.auto_name("barrier", None))], lambda _: None))


def join() -> int:
    """Block until every rank has joined, contributing zeros to other ranks' allreduces meanwhile.
    Returns the rank that joined last."""
    return run(([rq.join()], lambda res: res[0]))


def broadcast_object(obj, root_rank=0, name=None):
    """`obj` from root_rank on every rank (pickled)."""
    name = rq.auto_name("broadcast", name)
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if state.rank() == root_rank else np.empty(0, np.uint8)
    n = broadcast(np.array([data.size], dtype=np.int64), root_rank, f"{name}.size")
    if state.rank() != root_rank:
        data = np.empty(int(n[0]), dtype=np.uint8)
    data = broadcast(data, root_rank, f"{name}.data")
    return obj if state.rank() == root_rank else pickle.loads(data.tobytes())


def allgather_object(obj, name=None) -> list:
    """List of every rank's `obj` (pickled), in rank order."""
    name = rq.auto_name("allgather", name)
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    sizes = allgather(np.array([data.size], dtype=np.int64), f"{name}.size")
    blob = allgather(data, f"{name}.data").tobytes()
    ends = np.cumsum(sizes).tolist()
    return [pickle.loads(blob[e - s:e]) for s, e in zip(sizes.tolist(), ends)]


def _make_async(builder, doc_of):
    def start(*args, **kwargs) -> int:
        return submit(builder(*args, **kwargs))
    start.__doc__ = f"Start {doc_of.__name__} and return a handle for poll/synchronize."
    return start


allreduce_async = _make_async(_allreduce, allreduce)
allreduce_async_ = _make_async(_allreduce_, allreduce_)
grouped_allreduce_async = _make_async(_grouped_allreduce, grouped_allreduce)
allgather_async = _make_async(_allgather, allgather)
broadcast_async = _make_async(_broadcast, broadcast)
broadcast_async_ = _make_async(_broadcast_, broadcast_)
alltoall_async = _make_async(_alltoall, alltoall)
reducescatter_async = _make_async(_reducescatter, reducescatter)
