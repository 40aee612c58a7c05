"""The framework-free API on NumPy arrays (`import trainrun.runtime as hvd`).

Same names and semantics as horovod.torch, with NumPy arrays in place of tensors: `*_async` return
int handles for `poll`/`synchronize`; trailing-underscore variants work in place; ops are Average
(default), Sum, Min, Max, Product; `process_set=` picks the set's engine (lifecycle.engine). Inputs need
not be contiguous (a contiguous copy is made then).
"""
from __future__ import annotations

import pickle
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from trainrun.runtime import adasum
from trainrun.runtime import requests as rq
from trainrun.runtime import lifecycle
from trainrun.runtime.context import RUNTIME
from trainrun.runtime.fusion import dtype_name
from trainrun.runtime.ops import Adasum, Average, split_rows

if TYPE_CHECKING:
    from trainrun.runtime.engine import Engine

_DTYPE, _SHAPE, _SIZE = attrgetter("dtype"), attrgetter("shape"), attrgetter("size")


def submit(op, eng: Engine) -> int:
    """Start `op` = (Requests, finalize) on engine `eng` (lifecycle.engine(process_set)) and return its
    handle; `finalize(results)` makes what synchronize returns. An unnamed op holds its name's slot
    until it is synchronized (context.Session.next_name)."""
    reqs, finalize = op
    eng.submit(reqs)
    return lifecycle.add_handle([r.handle for r in reqs], finalize, eng, hold(reqs))


def hold(reqs):
    """The slot token an async op's auto-generated name holds (None for a named op). Grouped and
    sparse ops send `<name>.<suffix>` per tensor: their name is the part before the last dot."""
    if not reqs:
        return None
    session, name = RUNTIME.current(), reqs[0].name
    token = session.hold(name)
    if token is None and ".noname." in name:  # `<name>.<i>`: a member of a grouped or sparse op
        token = session.hold(name.rpartition(".")[0])
    return token


def run(op, eng: Engine):
    """Run `op` = (Requests, finalize) on `eng` to completion in the calling thread (no hand-off to
    the engine's)."""
    reqs, finalize = op
    return finalize(eng.run(reqs))


def root_in(eng: Engine, root_rank: int) -> int:
    """A broadcast's root (a global rank, as in Horovod) as a rank of `eng`'s process set."""
    if eng.set_id == 0:
        return root_rank
    try:
        return eng.ranks.index(root_rank)
    except ValueError:
        raise ValueError(f"root_rank {root_rank} is not in process set {eng.set_id} (ranks {eng.ranks})") from None


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


def _adasum(eng, a: np.ndarray, out: np.ndarray, name, prescale_factor, postscale_factor):
    """op=Adasum (adasum.py): an allgather of `a` (contiguous), combined into `out` on every rank."""
    dtype = dtype_name(a.dtype)
    adasum.check_dtype(dtype)
    req = rq.allgather(a.reshape(-1), (1, a.size), dtype, rq.auto_name("adasum", name, eng.set_id))
    return [req], lambda res: adasum.finish(res[0], eng.size, prescale_factor, postscale_factor, out)


def _allreduce(eng, tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0):
    a = _contiguous(tensor)
    out = np.empty_like(a)
    if op == Adasum:
        return _adasum(eng, a, out, name, prescale_factor, postscale_factor)
    req = rq.allreduce(a.reshape(-1), out.reshape(-1), a.shape, dtype_name(a.dtype),
                       rq.auto_name("allreduce", name, eng.set_id), op, prescale_factor, postscale_factor)
    return [req], (lambda _: out)


def allreduce(tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
              process_set=None) -> np.ndarray:
    """op over ranks of (tensor * prescale_factor), times postscale_factor; a new array."""
    eng = lifecycle.engine(process_set)
    if tensor.__class__ is np.ndarray and tensor.flags.c_contiguous and op != Adasum:  # the usual case
        out = np.empty_like(tensor)
        allreduce_into(eng, tensor.reshape(-1), out.reshape(-1), tensor.shape, dtype_name(tensor.dtype), name, op,
                       prescale_factor, postscale_factor)
        return out
    return run(_allreduce(eng, tensor, name, op, prescale_factor, postscale_factor), eng)


def allreduce_into(eng, send, recv, shape: tuple, dtype: str, name, op, prescale_factor, postscale_factor) -> None:
    """recv = op over ranks of send (None: in place on recv) for flat contiguous CPU arrays, blocking:
    the lone-op path without a Request where it applies (Engine.allreduce_now), else a Request. The
    fast path of every blocking CPU allreduce, NumPy's and the frameworks'. Checks as rq.allreduce
    (an op or dtype it refuses never reaches the response cache, so never the fast path)."""
    if name.__class__ is not str:
        name = rq.auto_name("allreduce", name, eng.set_id)
    if prescale_factor == 1.0 and eng.allreduce_now(send, recv, shape, dtype, name, op, float(postscale_factor)):
        return
    eng.run([rq.allreduce(recv if send is None else send, recv, shape, dtype, name, op, prescale_factor,
                          postscale_factor)])


def _allreduce_(eng, tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0):
    if tensor.__class__ is np.ndarray and tensor.flags.c_contiguous and tensor.flags.writeable:
        buf, finalize = tensor, (lambda _: tensor)  # the usual case: no copy, nothing to write back
    else:
        buf, done = _in_place(tensor)
        finalize = lambda _: done()  # noqa: E731
    if op == Adasum:
        reqs, fin = _adasum(eng, buf, buf, name, prescale_factor, postscale_factor)
        return reqs, lambda res: (fin(res), finalize(res))[1]
    flat = buf.reshape(-1)
    req = rq.allreduce(flat, flat, buf.shape, dtype_name(buf.dtype), rq.auto_name("allreduce", name, eng.set_id),
                       op, prescale_factor, postscale_factor)
    return [req], finalize


def allreduce_(tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
               process_set=None) -> np.ndarray:
    """allreduce into `tensor` itself (returned)."""
    eng = lifecycle.engine(process_set)
    if tensor.__class__ is np.ndarray and op != Adasum:
        flags = tensor.flags
        if flags.c_contiguous and flags.writeable:  # the usual case, in few steps (allreduce_into)
            allreduce_into(eng, None, tensor.reshape(-1), tensor.shape, dtype_name(tensor.dtype), name, op,
                           prescale_factor, postscale_factor)
            return tensor
    return run(_allreduce_(eng, tensor, name, op, prescale_factor, postscale_factor), eng)


def _grouped_allreduce(eng, tensors, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0):
    """One handle for a list, negotiated as one entry and reduced in one call. With one dtype the
    outputs are views of one fused buffer, so nothing is unpacked after the reduction (the per-tensor
    Python work is kept to a minimum: it dominates for many small tensors)."""
    base = rq.auto_name("grouped_allreduce", name, eng.set_id)
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
        fused = RUNTIME.outputs.get(arrays[0].dtype, len(arrays) * arrays[0].size)
        outs = list(fused.reshape((len(arrays),) + shapes[0]))
    else:
        sizes = list(map(_SIZE, arrays))
        fused = RUNTIME.outputs.get(arrays[0].dtype, sum(sizes))
        outs, off = [], 0
        for shape, n in zip(shapes, sizes):
            outs.append(fused[off:off + n].reshape(shape))
            off += n
    req = rq.group(arrays, outs, shapes, dtype_name(arrays[0].dtype), base, op, prescale_factor,
                   postscale_factor, fused)
    return [req], (lambda _: outs)


def grouped_allreduce(tensors, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=None) -> list:
    eng = lifecycle.engine(process_set)
    return run(_grouped_allreduce(eng, tensors, name, op, prescale_factor, postscale_factor), eng)


def _allgather(eng, tensor, name=None):
    """Concatenation along dim 0 of every rank's tensor; dim 0 may differ between ranks."""
    a = _contiguous(tensor)
    req = rq.allgather(a.reshape(-1), a.shape, dtype_name(a.dtype), rq.auto_name("allgather", name, eng.set_id))
    return [req], (lambda res: res[0])


def allgather(tensor, name=None, process_set=None) -> np.ndarray:
    eng = lifecycle.engine(process_set)
    return run(_allgather(eng, tensor, name), eng)


def _broadcast(eng, tensor, root_rank, name=None):
    root = root_in(eng, root_rank)
    a = _contiguous(tensor)
    out = a.copy() if eng.rank == root else np.empty_like(a)
    flat = out.reshape(-1)
    req = rq.broadcast(flat, flat, a.shape, dtype_name(a.dtype), rq.auto_name("broadcast", name, eng.set_id),
                       root, eng.size)
    return [req], (lambda _: out)


def broadcast(tensor, root_rank, name=None, process_set=None) -> np.ndarray:
    """root_rank's tensor, as a new array on every rank (shapes and dtypes must match)."""
    eng = lifecycle.engine(process_set)
    return run(_broadcast(eng, tensor, root_rank, name), eng)


def _broadcast_(eng, tensor, root_rank, name=None):
    root = root_in(eng, root_rank)
    buf, done = _in_place(tensor)
    flat = buf.reshape(-1)
    req = rq.broadcast(flat, flat, buf.shape, dtype_name(buf.dtype), rq.auto_name("broadcast", name, eng.set_id),
                       root, eng.size)
    return [req], (lambda _: done())


def broadcast_(tensor, root_rank, name=None, process_set=None) -> np.ndarray:
    eng = lifecycle.engine(process_set)
    return run(_broadcast_(eng, tensor, root_rank, name), eng)


def _alltoall(eng, tensor, splits=None, name=None):
    """Rows splits[r] of dim 0 go to rank r (equal parts when None). Result: output, plus the
    received splits when `splits` was given (as Horovod)."""
    a = _contiguous(tensor)
    req = rq.alltoall(a.reshape(-1), a.shape, dtype_name(a.dtype), rq.auto_name("alltoall", name, eng.set_id),
                      splits, eng.size)
    return [req], ((lambda res: res[0][0]) if splits is None else (lambda res: res[0]))


def alltoall(tensor, splits=None, name=None, process_set=None):
    eng = lifecycle.engine(process_set)
    return run(_alltoall(eng, tensor, splits, name), eng)


def _reducescatter(eng, tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0):
    """Reduce over ranks, then rank r keeps its slice of dim 0 (the first dim0 % size ranks get a row more)."""
    a = _contiguous(tensor)
    rq.check_dim("reducescatter", a.shape)
    rows = split_rows(a.shape[0], eng.size)[eng.rank]
    out = np.empty((rows,) + a.shape[1:], dtype=a.dtype)
    req = rq.reducescatter(a.reshape(-1), out.reshape(-1), a.shape, dtype_name(a.dtype),
                           rq.auto_name("reducescatter", name, eng.set_id), op, prescale_factor, postscale_factor)
    return [req], (lambda _: out)


def reducescatter(tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                  process_set=None) -> np.ndarray:
    eng = lifecycle.engine(process_set)
    return run(_reducescatter(eng, tensor, name, op, prescale_factor, postscale_factor), eng)


def barrier(process_set=None) -> None:
    eng = lifecycle.engine(process_set)
    run(([rq.barrier(rq.auto_name("barrier", None, eng.set_id))], lambda _: None), eng)


def join() -> int:
    """Block until every rank has joined, contributing zeros to other ranks' allreduces meanwhile.
    Returns the rank that joined last. (Global process set only.)"""
    return run(([rq.join()], lambda res: res[0]), lifecycle.engine())


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """`obj` from root_rank on every rank (pickled)."""
    eng = lifecycle.engine(process_set)
    name = rq.auto_name("broadcast", name, eng.set_id)
    root = eng.rank == root_in(eng, root_rank)
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if root else np.empty(0, np.uint8)
    n = broadcast(np.array([data.size], dtype=np.int64), root_rank, f"{name}.size", process_set)
    if not root:
        data = np.empty(int(n[0]), dtype=np.uint8)
    data = broadcast(data, root_rank, f"{name}.data", process_set)
    return obj if root else pickle.loads(data.tobytes())


def allgather_object(obj, name=None, process_set=None) -> list:
    """List of every rank's `obj` (pickled), in rank order (of the process set)."""
    name = rq.auto_name("allgather", name, lifecycle.engine(process_set).set_id)
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    sizes = allgather(np.array([data.size], dtype=np.int64), f"{name}.size", process_set)
    blob = allgather(data, f"{name}.data", process_set).tobytes()
    ends = np.cumsum(sizes).tolist()
    return [pickle.loads(blob[e - s:e]) for s, e in zip(sizes.tolist(), ends)]


def _make_async(builder, doc_of):
    def start(*args, process_set=None, **kwargs) -> int:
        eng = lifecycle.engine(process_set)
        return submit(builder(eng, *args, **kwargs), eng)
    start.__doc__ = f"Start {doc_of.__name__} and return a handle for poll/synchronize."
    return start


allreduce_async = _make_async(_allreduce, allreduce)


def allreduce_async_(tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=None) -> int:
    """Start allreduce_ and return a handle for poll/synchronize."""
    eng = lifecycle.engine(process_set)
    if tensor.__class__ is np.ndarray and op != Adasum:
        flags = tensor.flags
        if flags.c_contiguous and flags.writeable:  # the usual case (one call per gradient), in few steps
            flat = tensor.reshape(-1)
            named = name.__class__ is str
            req = rq.allreduce(flat, flat, tensor.shape, dtype_name(tensor.dtype),
                               name if named else rq.auto_name("allreduce", name, eng.set_id),
                               op, prescale_factor, postscale_factor)
            eng.submit([req])
            return lifecycle.add_handle([req.handle], lambda _: tensor, eng, None if named else hold([req]))
    return submit(_allreduce_(eng, tensor, name, op, prescale_factor, postscale_factor), eng)


grouped_allreduce_async = _make_async(_grouped_allreduce, grouped_allreduce)
allgather_async = _make_async(_allgather, allgather)
broadcast_async = _make_async(_broadcast, broadcast)
broadcast_async_ = _make_async(_broadcast_, broadcast_)
alltoall_async = _make_async(_alltoall, alltoall)
reducescatter_async = _make_async(_reducescatter, reducescatter)
