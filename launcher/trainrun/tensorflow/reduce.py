"""Gradients reduced over ranks, for every TensorFlow optimizer wrapper (tf.compat.v1, Keras, GradientTape):
dense gradients in grouped allreduces, IndexedSlices allgathered (or densified with sparse_as_dense), as
Horovod does.

Buckets: in a graph (fit's step, a tf.function, a TF1 graph) the dense gradients travel in fused buckets
taken from the last variable back -- backward computes the last layers' gradients first -- the first
bucket small (FIRST_BUCKET_BYTES, as DDP's first bucket) and the others up to BUCKET_BYTES: each bucket
is one native node (graph_ops.py) that starts as soon as its own gradients exist, so the reduction of
the first buckets runs while backward still computes the rest. Eagerly every gradient already exists:
one grouped allreduce."""
from __future__ import annotations

import hashlib

import tensorflow as tf

from trainrun.runtime.ops import Average
from trainrun.runtime.process_sets import global_process_set
from trainrun.tensorflow.compression import Compression
from trainrun.tensorflow.mpi_ops import _set_rank, allreduce, grouped_allreduce

FIRST_BUCKET_BYTES = 1 << 20
BUCKET_BYTES = 8 << 20


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
    groups = buckets(dense, [out[i] for i in dense]) if not tf.executing_eagerly() else [dense]
    for k, group in enumerate(groups):
        reduced = grouped_allreduce([out[i] for i in group], compression=compression, op=op, prescale_factor=pre,
                                    postscale_factor=post, name=name if len(groups) == 1 else f"{name}.b{k}",
                                    process_set=process_set)
        for i, r in zip(group, reduced):
            out[i] = r
    return out


def buckets(indices: list, tensors: list) -> list[list]:
    """`indices` (of `tensors`) in buckets, from the last back (module docstring); a tensor of unknown
    size starts a new bucket."""
    groups: list[list] = []
    group: list = []
    size, cap = 0, FIRST_BUCKET_BYTES
    for i, t in zip(reversed(indices), reversed(tensors)):
        n = t.shape.num_elements()
        nbytes = None if n is None else n * t.dtype.size
        if group and (nbytes is None or size + nbytes > cap):
            groups.append(group)
            group, size, cap = [], 0, BUCKET_BYTES
        group.append(i)
        size += nbytes or 0
    if group:
        groups.append(group)
    return groups
