"""horovod.tensorflow's collective ops on TensorFlow tensors, over the framework-free runtime.

Eagerly, a CPU tensor reaches the runtime as a NumPy view of its own buffer (`EagerTensor._numpy()`,
no copy) and the runtime's result array becomes a tensor through DLPack (no copy either). Inside
`tf.function` or a TF1 graph each op is one node (graph_ops.py: one native asynchronous kernel per collective, which hands TF's buffers to the runtime;
no node holds a TF thread while the collective is in flight, so any number of independent collectives
in one graph complete, in any executor order).

Names: an explicit `name` is used as is. Without one, eager ops take the runtime's per-kind counter
(ranks calling in the same order agree); graph ops are named after their input tensor at trace time,
as Horovod does, so a graph op keeps one name across steps (the response cache's fast path).

Gradients (horovod.tensorflow's convention, which averages where trainrun.torch's sums): of an
allreduce, the same allreduce of the gradient; of an allgather, this rank's slice of the averaged
gradient; of a broadcast, the averaged gradient on the root and zeros elsewhere; of a reducescatter,
the allgathered gradient (times the set size for Sum); of an alltoall, the alltoall of the gradient
back by the received splits. Eagerly the gradient is recorded only while a tape could be watching
(tf.custom_gradient costs ~100 us a call).
"""
from __future__ import annotations

import re
import weakref

import numpy as np
import tensorflow as tf

import trainrun.runtime as rt
from trainrun.runtime import api
from trainrun.runtime.fusion import dtype_name
from trainrun.runtime.ops import handle_average_backwards_compatibility
from trainrun.runtime import lifecycle
from trainrun.runtime.ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 (re-exported)
from trainrun.runtime.process_sets import global_process_set
from trainrun.tensorflow import buffers, failures, graph_ops
from trainrun.tensorflow.compression import Compression

from tensorflow.python.framework.ops import EagerTensor as _EagerTensor  # (no public name; making a tensor
                                                                        # here would start TF's context too early)
try:  # TF's own "could a GradientTape record this op?" (public API has none; ~0.2 us)
    from tensorflow.python.eager.record import could_possibly_record as _could_record
except ImportError:  # pragma: no cover  (older/newer TF: always record)
    def _could_record() -> bool:
        return True

_UNSAFE = re.compile(r"[^A-Za-z0-9_./-]")
# dtypes whose NumPy view is the runtime's storage dtype (bfloat16's view is ml_dtypes', not uint16)
_PLAIN = frozenset(np.dtype(d) for d in ("float16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64"))


def _check_op(op):
    """`op`, unless trainrun cannot run it."""
    if op == Adasum:
        raise NotImplementedError("op=Adasum is not supported by trainrun; use Average or Sum")
    return op


# ---- tensor <-> NumPy ----------------------------------------------------------------------
def _view(t) -> np.ndarray:
    """A NumPy view of an eager CPU tensor's buffer (read only by contract: the runtime never writes
    its inputs)."""
    numpy = getattr(t, "_numpy", None)
    return numpy() if numpy is not None else np.asarray(t)


_wrap = buffers.to_tensor


def _eager() -> bool:
    return tf.executing_eagerly()


def _graph_name(kind: str, name, tensor) -> str:
    """An explicit name as it is; else `kind`.<input tensor's name>, made unique in the graph (as TF makes
    Horovod's op names unique): two collectives of one tensor in a graph may be in flight together.
    Graphs are built alike on every rank, so every rank picks the same names."""
    if name is not None:
        return name
    base = f"{kind}.{_UNSAFE.sub('_', tensor.name)}"
    used = _GRAPH_NAMES.setdefault(tensor.graph, {})
    count = used.get(base, 0)
    used[base] = count + 1
    return base if count == 0 else f"{base}_{count}"


_GRAPH_NAMES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # graph -> {name: times used}


def _started(async_fn, fn, blocking, *args, process_set=None, **kw):
    """graph_ops' `start`: the (handle, engine) of the runtime's async op `async_fn` started on
    `process_set`, or with `blocking` the result of its blocking twin `fn`."""
    if blocking:
        return fn(*args, process_set=process_set, **kw)
    return async_fn(*args, process_set=process_set, **kw), lifecycle.engine(process_set)


def _same(result):
    return result


def _bf16(tensor) -> bool:
    """An eager bfloat16 tensor: it crosses to the runtime as float32 and comes back rounded once, as
    in graphs (graph_ops.collective). Its NumPy view is ml_dtypes' bfloat16, which the runtime (whose
    bfloat16 is a uint16 bit pattern) would read by value: wrong sums, uint16 results."""
    return tensor.dtype == tf.bfloat16


def _f32(tensor):
    return tf.cast(tensor, tf.float32)


def _back(tensor):
    return tf.cast(tensor, tf.bfloat16)


def _set_rank(process_set) -> tuple[int, int]:
    """(this rank's index in the set, the set's size)."""
    ps = process_set if process_set is not None else global_process_set
    if ps.process_set_id == 0:
        return lifecycle.rank(), lifecycle.size()
    return ps.rank(), ps.size()


def _recorded(forward, backward, *tensors):
    """forward(*tensors) with `backward(dy...) -> dx...` as its gradient (skipped eagerly when no tape
    could record it)."""
    if _eager() and not _could_record():
        return forward(*tensors)

    @tf.custom_gradient
    def op(*xs):
        return forward(*xs), backward
    return op(*tensors)


# ---- raw ops (no gradient) ------------------------------------------------------------------
def _allreduce(tensor, name, op, pre, post, process_set):
    kw = dict(op=op, prescale_factor=pre, postscale_factor=post, process_set=process_set)
    if _eager():
        if _bf16(tensor):
            return _back(_allreduce(_f32(tensor), name, op, pre, post, process_set))
        a = _view(tensor)
        out = buffers.empty(a.shape, a.dtype)
        np.copyto(out, a)  # the one copy an out-of-place op needs; the reduction then runs in place
        return _wrap(rt.allreduce_(out, name=name, **kw))
    gname = _graph_name("allreduce", name, tensor)
    out = graph_ops.collective(
        lambda a, blocking=False: _started(rt.allreduce_async, rt.allreduce, blocking, a, name=gname, **kw),
        _same, [tensor], tensor.dtype, "TrainrunAllreduce",
        in_place=lambda flat, blocking: _started(rt.allreduce_async_, rt.allreduce_, blocking, flat, name=gname, **kw))
    out.set_shape(tensor.shape)
    return out


def _grouped_allreduce(tensors, name, op, pre, post, process_set) -> list:
    kw = dict(op=op, prescale_factor=pre, postscale_factor=post, process_set=process_set)
    if not tensors:
        return []
    if _eager():
        if any(_bf16(t) for t in tensors):
            outs = _grouped_allreduce([_f32(t) if _bf16(t) else t for t in tensors], name, op, pre, post, process_set)
            return [_back(o) if _bf16(t) else o for o, t in zip(outs, tensors)]
        return _grouped_eager([_view(t) for t in tensors], name, kw)
    gname = _graph_name("grouped_allreduce", name, tensors[0])
    outs = graph_ops.collective(lambda *a, blocking=False: _started(
        rt.grouped_allreduce_async, rt.grouped_allreduce, blocking, list(a), name=gname, **kw), _same,
                                tensors, [t.dtype for t in tensors], "TrainrunGroupedAllreduce",
                                in_place=lambda flat, blocking: _started(
                                    rt.allreduce_async_, rt.allreduce_, blocking, flat, name=gname, **kw))
    for o, t in zip(outs, tensors):
        o.set_shape(t.shape)
    return list(outs)


def _grouped_eager(arrays: list, name, kw) -> list:
    """Eager grouped allreduce: per dtype, the arrays are packed into one aligned buffer (each at an
    aligned offset, so every result is a tensor on that buffer without a copy) that is reduced in
    place as one op; so a group costs one negotiation and one reduction per dtype."""
    if name is None:
        name = rq_name("grouped_allreduce", kw["process_set"])
    by_dtype: dict = {}
    for i, a in enumerate(arrays):
        by_dtype.setdefault(a.dtype, []).append(i)
    outs = [None] * len(arrays)
    for k, (dtype, idx) in enumerate(sorted(by_dtype.items(), key=lambda kv: kv[0].str)):
        step = buffers.ALIGN // dtype.itemsize
        offsets, total = [], 0
        for i in idx:
            offsets.append(total)
            total += -(-arrays[i].size // step) * step
        flat = buffers.empty((total,), dtype)
        for i, off in zip(idx, offsets):
            a = arrays[i]
            np.copyto(flat[off:off + a.size].reshape(a.shape), a)
        rt.allreduce_(flat, name=name if len(by_dtype) == 1 else f"{name}.{k}", **kw)
        for i, off in zip(idx, offsets):
            outs[i] = _wrap(flat[off:off + arrays[i].size].reshape(arrays[i].shape))
    return outs


def rq_name(kind: str, process_set) -> str:
    """The next automatic name of `kind` on the set (ranks calling in the same order agree)."""
    ps = process_set if process_set is not None else global_process_set
    counter = _COUNTERS.setdefault((ps.process_set_id, kind), [0])
    counter[0] += 1
    return f"{kind}.tf.{counter[0]}"


_COUNTERS: dict = {}


def _allgather(tensor, name, process_set):
    if _eager():
        if _bf16(tensor):
            return _back(_allgather(_f32(tensor), name, process_set))
        return _wrap(rt.allgather(_view(tensor), name=name, process_set=process_set))
    gname = _graph_name("allgather", name, tensor)
    out = graph_ops.collective(
        lambda a, blocking=False: _started(rt.allgather_async, rt.allgather, blocking, a, name=gname,
                                           process_set=process_set),
        _same, [tensor], tensor.dtype, "TrainrunAllgather")
    out.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]) if tensor.shape.rank else None)
    return out


def _broadcast(tensor, root_rank, name, process_set):
    if _eager():
        if _bf16(tensor):
            return _back(_broadcast(_f32(tensor), root_rank, name, process_set))
        return _wrap(rt.broadcast(_view(tensor), root_rank, name=name, process_set=process_set))
    gname = _graph_name("broadcast", name, tensor)
    out = graph_ops.collective(
        lambda a, blocking=False: _started(rt.broadcast_async, rt.broadcast, blocking, a, root_rank, name=gname,
                                           process_set=process_set),
        _same, [tensor], tensor.dtype, "TrainrunBroadcast",
        in_place=lambda flat, blocking: _started(rt.broadcast_async_, rt.broadcast_, blocking, flat, root_rank,
                                                 name=gname, process_set=process_set))
    out.set_shape(tensor.shape)
    return out


def _reducescatter(tensor, name, op, pre, post, process_set):
    kw = dict(op=op, prescale_factor=pre, postscale_factor=post, process_set=process_set)
    if _eager():
        if _bf16(tensor):
            return _back(_reducescatter(_f32(tensor), name, op, pre, post, process_set))
        return _wrap(rt.reducescatter(_view(tensor), name=name, **kw))
    gname = _graph_name("reducescatter", name, tensor)
    out = graph_ops.collective(
        lambda a, blocking=False: _started(rt.reducescatter_async, rt.reducescatter, blocking, a, name=gname,
                                           **kw),
        _same, [tensor], tensor.dtype, "TrainrunReducescatter")
    out.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]) if tensor.shape.rank else None)
    return out


def _in_order(thunks) -> list:
    """The results of `thunks` (each builds collectives), called in order; in a graph each one's nodes
    run only after the previous one's results exist. Independent collectives in one graph otherwise run
    in whatever order TF's executor picks on each rank, each blocking an inter-op thread until the
    other ranks reach it: more of them than threads can wait on each other for good."""
    outs: list = []
    after: list = []
    for thunk in thunks:
        if after and not _eager():
            with tf.control_dependencies(after):
                out = thunk()
        else:
            out = thunk()
        outs.append(out)
        after = [t for t in tf.nest.flatten(out, expand_composites=True) if isinstance(t, tf.Tensor)]
    return outs


def _check_sparse(op, prescale_factor, postscale_factor) -> None:
    """Horovod's refusals for tf.IndexedSlices (which are gathered, not reduced)."""
    if op not in (Average, Sum):
        raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")


# ---- public ops ---------------------------------------------------------------------------
def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """`tensor` reduced over the ranks of `process_set` (default Average), as a new tensor.

    A `tf.IndexedSlices` is gathered, not reduced (as Horovod): values and indices are allgathered
    and the values divided by the set size for Average. Differentiable."""
    if tensor.__class__ is _EagerTensor and compression is Compression.none and average is None \
            and op != Adasum and not _could_record() and tf.executing_eagerly():
        a = tensor._numpy()
        if a.dtype in _PLAIN:  # the common eager call (a metric, a custom loop), without the layers below
            out = buffers.empty_like(a)
            try:
                api.allreduce_into(lifecycle.engine(process_set), a.reshape(-1), out.reshape(-1), a.shape,
                                   dtype_name(a.dtype), name, Average if op is None else op, prescale_factor,
                                   postscale_factor)
            except failures.CAUGHT as e:
                raise failures.as_tf_error(e) from None
            return buffers.adopt(out)
    return _allreduce_any(tensor, average, compression, op, prescale_factor, postscale_factor, name, process_set)


@failures.raising
def _allreduce_any(tensor, average, compression, op, prescale_factor, postscale_factor, name, process_set):
    op = _check_op(handle_average_backwards_compatibility(op, average))
    if isinstance(tensor, tf.IndexedSlices):
        _check_sparse(op, prescale_factor, postscale_factor)
        values, indices = _in_order([
            lambda: allgather(tensor.values, name=None if name is None else f"{name}.values", process_set=process_set),
            lambda: allgather(tensor.indices, name=None if name is None else f"{name}.indices",
                              process_set=process_set)])
        if op == Average:
            values = values / tf.cast(_set_rank(process_set)[1], values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    pre, post = float(prescale_factor), float(postscale_factor)
    reduced = _recorded(lambda x: _allreduce(x, name, op, pre, post, process_set),
                        lambda dy: _allreduce(dy, None, op, pre, post, process_set), compressed)
    return compression.decompress(reduced, ctx)


@failures.raising
def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, name=None,
                      process_set=global_process_set) -> list:
    """allreduce of a list in one negotiation and (per dtype) one fused reduction. Differentiable.
    tf.IndexedSlices in the list are gathered, each as allreduce does (op Average or Sum only)."""
    op = _check_op(handle_average_backwards_compatibility(op, average))
    tensors = list(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    if sparse:
        _check_sparse(op, prescale_factor, postscale_factor)
        dense = [i for i in range(len(tensors)) if i not in sparse]
        out = [None] * len(tensors)
        reduced, *gathered = _in_order(
            [lambda: grouped_allreduce([tensors[i] for i in dense], compression=compression, op=op, name=name,
                                       process_set=process_set)]
            + [lambda i=i: allreduce(tensors[i], op=op, name=None if name is None else f"{name}.sparse.{i}",
                                     process_set=process_set) for i in sparse])
        for i, r in zip(dense + sparse, list(reduced) + gathered):
            out[i] = r
        return out
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    pairs = [compression.compress(t) for t in tensors]
    pre, post = float(prescale_factor), float(postscale_factor)

    def forward(*xs):
        return _grouped_allreduce(list(xs), name, op, pre, post, process_set)

    def backward(*dys):
        return _grouped_allreduce([tf.convert_to_tensor(d) for d in dys], None, op, pre, post, process_set)
    reduced = _recorded(forward, backward, *[t for t, _ in pairs]) if pairs else []
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, pairs)]


@failures.raising
def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Every rank's tensor concatenated along dim 0 (which may differ per rank). Differentiable."""
    tensor = tf.convert_to_tensor(tensor)

    def backward(dy):
        dy, dims = _in_order([
            lambda: _allreduce(tf.convert_to_tensor(dy), None, Average, 1.0, 1.0, process_set),
            lambda: _allgather(tf.reshape(tf.shape(tensor, out_type=tf.int64)[0], [1]), None, process_set)])
        me = _set_rank(process_set)[0]
        offset = tf.reduce_sum(dims[:me])
        return dy[offset:offset + tf.shape(tensor, out_type=tf.int64)[0]]
    return _recorded(lambda x: _allgather(x, name, process_set), backward, tensor)


@failures.raising
def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """root_rank's tensor (root_rank: a global rank) on every rank of the set. Differentiable."""
    tensor = tf.convert_to_tensor(tensor)

    def backward(dy):
        dy = _allreduce(tf.convert_to_tensor(dy), None, Average, 1.0, 1.0, process_set)
        # the same ops on every rank (graph ops are named after tensors: rank-dependent graph
        # structure would give later ops different names on different ranks)
        return dy * tf.cast(lifecycle.rank() == root_rank, dy.dtype)
    return _recorded(lambda x: _broadcast(x, root_rank, name, process_set), backward, tensor)


@failures.raising
def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduce over ranks, keep this rank's slice of dim 0 (the first dim0 % size ranks get a row more).
    Differentiable."""
    op = _check_op(op)
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    pre, post = float(prescale_factor), float(postscale_factor)

    def backward(dy):
        dy = tf.convert_to_tensor(dy)
        if op == Sum:  # (Horovod's scale: each rank's slice counted once per rank)
            dy = dy * tf.cast(_set_rank(process_set)[1], dy.dtype)
        return _allgather(dy, None, process_set)
    out = _recorded(lambda x: _reducescatter(x, name, op, pre, post, process_set), backward, compressed)
    return compression.decompress(out, ctx)


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set) -> list:
    """allgather of each tensor of a list (named `name`.i when named). Differentiable."""
    return _in_order([lambda i=i, t=t: allgather(t, name=None if name is None else f"{name}.{i}",
                                                 process_set=process_set) for i, t in enumerate(tensors)])


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0) -> list:
    """reducescatter of each tensor of a list. Differentiable."""
    return _in_order([lambda t=t: reducescatter(t, compression=compression, op=op, process_set=process_set,
                                                prescale_factor=prescale_factor, postscale_factor=postscale_factor)
                      for t in tensors])


def _alltoall(tensor, splits, name, process_set):
    """(output, received splits) of one alltoall (splits: a list, tensor or None for equal parts)."""
    n = _set_rank(process_set)[1]

    def run(a, s, op_name):
        if s is None:
            if a.ndim == 0 or a.shape[0] % n:  # the runtime's own error message
                return rt.alltoall(a, None, name=op_name, process_set=process_set), None
            s = [a.shape[0] // n] * n  # explicit, so that the received splits come back
        out, received = rt.alltoall(a, s, name=op_name, process_set=process_set)
        return out, np.asarray(received, dtype=np.int64)

    if _eager():
        if _bf16(tensor):
            out, received = _alltoall(_f32(tensor), splits, name, process_set)
            return _back(out), received
        out, received = run(_view(tensor), None if splits is None else np.asarray(splits), name)
        return _wrap(out), tf.convert_to_tensor(received)
    gname = _graph_name("alltoall", name, tensor)
    inputs = [tensor] + ([tf.cast(splits, tf.int64)] if splits is not None else [])

    def start(a, *s, blocking=False):
        s = s[0] if s else None
        if s is None and a.ndim and a.shape[0] % n == 0:
            s = [a.shape[0] // n] * n  # explicit, so that the received splits come back
        return _started(rt.alltoall_async, rt.alltoall, blocking, a, s, name=gname, process_set=process_set)

    def finish(result):  # (start raised for an indivisible dim 0 without splits: the runtime's message)
        out, got = result
        return out, np.asarray(got, dtype=np.int64)
    out, received = graph_ops.collective(start, finish, inputs, [tensor.dtype, tf.int64], "TrainrunAlltoall")
    out.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]) if tensor.shape.rank else None)
    received.set_shape([n])
    return out, received


@failures.raising
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Rows splits[r] of dim 0 go to rank r (equal parts when None). Returns the output alone, or
    (output, received_splits) when `splits` is given, as horovod.tensorflow 0.28.1 does.
    Differentiable: the gradient is the alltoall of the output's gradient back, by the received splits."""
    tensor = tf.convert_to_tensor(tensor)
    received = []

    def forward(x):
        out, got = _alltoall(x, splits, name, process_set)
        received.append(got)
        return out

    def backward(dy):
        return _alltoall(tf.convert_to_tensor(dy), received[0], None, process_set)[0]
    out = _recorded(forward, backward, tensor)
    return out if splits is None else (out, received[0])


def join() -> int:
    """Stop contributing: until every rank has joined, this rank adds zeros to the others' allreduces.
    Returns the rank that joined last."""
    return rt.join()


def barrier(process_set=global_process_set) -> None:
    rt.barrier(process_set=process_set)


def size_op(process_set_id: int = 0, name=None):
    """The set's size as an int32 tensor (Horovod's size_op; evaluated now, a constant in graphs)."""
    return tf.constant(_set_size_by_id(process_set_id), dtype=tf.int32, name=name)


def process_set_included_op(process_set_id: int = 0, name=None):
    """1 (int32) when this rank belongs to the set, else 0 (Horovod's; evaluated now, a constant in graphs)."""
    for ps in lifecycle.process_sets():
        if ps.process_set_id == process_set_id:
            return tf.constant(int(process_set_id == 0 or ps.included()), dtype=tf.int32, name=name)
    raise ValueError(f"no process set with id {process_set_id}")


def ccl_built() -> bool:
    """False: trainrun has no oneCCL backend."""
    return False


def ddl_built() -> bool:
    """False: trainrun has no IBM DDL backend."""
    return False


def rank_op(name=None):
    return tf.constant(lifecycle.rank(), dtype=tf.int32, name=name)


def local_rank_op(name=None):
    return tf.constant(lifecycle.local_rank(), dtype=tf.int32, name=name)


def local_size_op(name=None):
    return tf.constant(lifecycle.local_size(), dtype=tf.int32, name=name)


def _set_size_by_id(process_set_id: int) -> int:
    for ps in lifecycle.process_sets():
        if ps.process_set_id == process_set_id:
            return lifecycle.size() if process_set_id == 0 else ps.size()
    raise ValueError(f"no process set with id {process_set_id}")
