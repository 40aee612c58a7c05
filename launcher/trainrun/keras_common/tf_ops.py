"""Collectives on Keras values for Keras on TensorFlow (Keras 3's tensorflow backend, or tf-keras):
trainrun.tensorflow's ops, which also run inside the tf.function that `fit` compiles."""
from __future__ import annotations

import tensorflow as tf

from trainrun.runtime.process_sets import global_process_set
from trainrun.tensorflow import mpi_ops
from trainrun.tensorflow.compression import Compression
from trainrun.tensorflow.functions import broadcast_variables as _broadcast_variables
from trainrun.tensorflow.reduce import reduce_gradients as _reduce

__all__ = ["Compression", "accumulate_in_graph", "allgather", "allreduce", "broadcast", "broadcast_variables", "clone",
           "in_graph", "reducescatter", "reduce_gradients"]


def _tensor(value):
    value = getattr(value, "value", value)  # a Keras 3 variable's tf.Variable
    return tf.convert_to_tensor(value() if callable(value) else value)


def allreduce(value, name=None, average=None, op=None, prescale_factor=1.0, postscale_factor=1.0):
    """`value` reduced over ranks (default: averaged)."""
    return mpi_ops.allreduce(_tensor(value), average=average, name=name, op=op,
                             prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def allgather(value, name=None):
    return mpi_ops.allgather(_tensor(value), name=name)


def broadcast(value, root_rank, name=None):
    return mpi_ops.broadcast(_tensor(value), root_rank, name=name)


def reducescatter(value, name=None, op=None):
    return mpi_ops.reducescatter(_tensor(value), name=name, op=mpi_ops.Average if op is None else op)


def broadcast_variables(variables, root_rank: int, prefix: str = "broadcast_variables") -> None:
    """Assign `root_rank`'s values to `variables` on every rank (now, eagerly)."""
    _broadcast_variables(list(variables), root_rank, global_process_set, prefix=prefix)


def clone(g):
    return tf.identity(g)


def reduce_gradients(grads, variables, *, name, op, pre, post, compression, sparse_as_dense, process_set) -> list:
    """The non-None `grads` reduced in one grouped allreduce (IndexedSlices gathered unless
    sparse_as_dense); `pre`/`post` come from gradient_predivide_factor."""
    return _reduce(grads, variables, name=name, compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                   gradient_predivide_factor=post if op == mpi_ops.Average else 1.0, process_set=process_set)


def in_graph() -> bool:
    """Inside a tf.function being traced (fit's step): Python runs once, the graph every step."""
    return not tf.executing_eagerly()


def accumulate_in_graph(settings, grads, apply) -> None:
    """backward_passes_per_step inside a tf.function: add `grads` to accumulator variables and, on every
    `settings.passes`-th call, run apply(accumulated) -- reduce over ranks and update -- then zero them,
    in a tf.cond: every rank takes the branch on the same steps, so its collectives match. The
    variables are made on the first trace (outside the function, as tf.function requires) and kept in
    `settings.graph`; IndexedSlices gradients accumulate dense."""
    if settings.graph is None:
        with tf.init_scope():
            accs = [None if g is None else tf.Variable(tf.zeros(g.shape, g.dtype), trainable=False)
                    for g in grads]
            settings.graph = (accs, tf.Variable(0, dtype=tf.int64, trainable=False))
    accs, count = settings.graph
    for a, g in zip(accs, grads):
        if a is not None and g is not None:
            a.assign_add(tf.convert_to_tensor(g))
    passes = settings.passes

    def update():
        scale = 1.0 / passes if settings.average_aggregated else 1.0
        apply([None if a is None else (a.read_value() * scale if scale != 1.0 else a.read_value()) for a in accs])
        for a in accs:
            if a is not None:
                a.assign(tf.zeros_like(a))
        count.assign(0)
        return tf.constant(True)

    tf.cond(count.assign_add(1) >= passes, update, lambda: tf.constant(False))
