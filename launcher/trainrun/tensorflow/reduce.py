"""Gradients reduced over ranks, for every TensorFlow optimizer wrapper (tf.compat.v1, Keras, GradientTape):
dense gradients in one grouped allreduce, IndexedSlices allgathered (or densified with sparse_as_dense), as
Horovod does."""
from __future__ import annotations

import hashlib

import tensorflow as tf

from trainrun.runtime.ops import Average
from trainrun.runtime.process_sets import global_process_set
from trainrun.tensorflow.compression import Compression
from trainrun.tensorflow.mpi_ops import _set_rank, allreduce, grouped_allreduce


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
    reduced = grouped_allreduce([out[i] for i in dense], compression=compression, op=op, prescale_factor=pre,
                                postscale_factor=post, name=name, process_set=process_set)
    for i, r in zip(dense, reduced):
        out[i] = r
    return out
