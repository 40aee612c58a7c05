"""Gradients reduced over ranks, for every TensorFlow optimizer wrapper (tf.compat.v1, Keras, GradientTape):
dense gradients in grouped allreduces, IndexedSlices allgathered (or densified with sparse_as_dense), as
Horovod does.

Buckets: in a graph (fit's step, a tf.function, a TF1 graph) the dense gradients travel in fused buckets
taken from the last variable back -- backward computes the last layers' gradients first -- each closed at
the runtime's bucket size (runtime/horovod_env.py: TRAINRUN_BUCKET_BYTES, 25 MiB, as torch's
DistributedOptimizer buckets): each bucket is one native node (graph_ops.py) that starts as soon as its
own gradients exist, so on a model larger than a bucket the reduction of the first buckets runs while
backward still computes the rest. No smaller first bucket (FIRST_BUCKET_BYTES = 0, as torch's
buckets.FIRST_BYTES): on 2 ranks sharing 2 cores a 1 MiB first bucket made Keras fit of 100 x Dense(64)
(3.3 MB of gradients) slower, 10.7-12.9 ms a step against 8.7-9.8 ms in one bucket (issue 40, same-run
A/B): overlap needs a core to overlap on. Eagerly every gradient already exists: one grouped allreduce.
"""
from __future__ import annotations

import hashlib

import tensorflow as tf

from trainrun.runtime import lifecycle
from trainrun.runtime.ops import Average
from trainrun.runtime.process_sets import global_process_set
from trainrun.tensorflow.compression import Compression
from trainrun.tensorflow.mpi_ops import _set_rank, allreduce, grouped_allreduce

FIRST_BUCKET_BYTES = 0  # the first bucket's cap (0: none; DDP's is 1 << 20); never above the bucket size


def grads_name(prefix: str, variables) -> str:
    """A name for the gradients of `variables`: the same on every rank and every step."""
    names = "\0".join(str(getattr(v, "path", None) or getattr(v, "name", i)) for i, v in enumerate(variables))
    return f"{prefix}.{len(variables)}.{hashlib.sha1(names.encode()).hexdigest()[:16]}"


def reduce_gradients(grads, variables, *, name, compression=Compression.none, sparse_as_dense=False, op=Average,
                     gradient_predivide_factor=1.0, process_set=global_process_set) -> list:
    """`grads` (tensors, IndexedSlices or None, one per variable) reduced over the set's ranks."""
    grads = list(grads)
    if _set_rank(process_set)[1] == 1:
        return grads
    out, dense = list(grads), []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if not sparse_as_dense:
                out[i] = allreduce(g, op=op, name=f"{name}.sparse.{i}", process_set=process_set)
                continue
            out[i] = tf.convert_to_tensor(g)
        dense.append(i)
    pre, post = (1.0 / gradient_predivide_factor, gradient_predivide_factor) if op == Average else (1.0, 1.0)
    groups = [dense] if tf.executing_eagerly() else buckets(dense, [out[i] for i in dense],
                                                              lifecycle.settings().bucket_bytes)
    for k, group in enumerate(groups):
        reduced = grouped_allreduce([out[i] for i in group], compression=compression, op=op, prescale_factor=pre,
                                    postscale_factor=post, name=name if len(groups) == 1 else f"{name}.b{k}",
                                    process_set=process_set)
        for i, r in zip(group, reduced):
            out[i] = r
    return out


def buckets(indices: list, tensors: list, cap: int, first: int = FIRST_BUCKET_BYTES) -> list[list]:
    """`indices` (of `tensors`) in buckets from the last back, each closed at `cap` bytes (the first at
    `first` when it is > 0); `cap` <= 0: one bucket. A tensor of unknown size starts a new bucket."""
    if cap <= 0:
        return [list(indices)] if indices else []
    groups: list[list] = []
    group: list = []
    size, limit = 0, min(first, cap) if first > 0 else cap
    for i, t in zip(reversed(indices), reversed(tensors)):
        n = t.shape.num_elements()
        nbytes = None if n is None else n * t.dtype.size
        if group and (nbytes is None or size + nbytes > limit):
            groups.append(group)
            group, size, limit = [], 0, cap
        group.append(i)
        size += nbytes or 0
    if group:
        groups.append(group)
    return groups
