"""Horovod's SyncBatchNormalization for tf.keras: batch statistics over the whole batch of every rank.

A subclass of the BatchNormalization of the tf.keras in use (Keras 3 or tf-keras). In training, the
mean and variance come from the per-rank sums of x and x*x and the element counts, summed over the
process set in one grouped allreduce (differentiable: the gradient flows through the summed moments
to every rank's inputs); at inference it is the plain layer (moving statistics).
"""
from __future__ import annotations

import tensorflow as tf

from trainrun.runtime.ops import Sum
from trainrun.runtime.process_sets import global_process_set
from trainrun.tensorflow.mpi_ops import grouped_allreduce


def global_moments(x, axes, keepdims: bool, process_set=global_process_set):
    """(mean, variance) of `x` over `axes` and over the ranks of `process_set` together."""
    axes = [a % x.shape.rank for a in axes]
    work = tf.cast(x, tf.float32) if x.dtype in (tf.float16, tf.bfloat16) else x
    total = tf.reduce_sum(work, axes, keepdims=True)
    squares = tf.reduce_sum(tf.square(work), axes, keepdims=True)
    count = tf.reshape(tf.cast(tf.reduce_prod(tf.gather(tf.shape(work), axes)), work.dtype), [1])
    total, squares, count = grouped_allreduce([total, squares, count], op=Sum, process_set=process_set)
    mean = total / count
    variance = tf.maximum(squares / count - tf.square(mean), 0.0)
    if not keepdims:
        mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
    return tf.cast(mean, x.dtype), tf.cast(variance, x.dtype)


def _make_class():
    base = tf.keras.layers.BatchNormalization
    _KERAS2 = hasattr(base, "_calculate_mean_and_var")  # tf-keras; Keras 3 has _moments

    class SyncBatchNormalization(base):
        """tf.keras BatchNormalization whose training statistics span every rank of `process_set`
        (Horovod's signature: the layer's own arguments, plus process_set as a keyword)."""

        def __init__(self, *args, process_set=global_process_set, **kwargs):
            if _KERAS2:
                kwargs["fused"] = False  # the fused kernel computes its own moments
            super().__init__(*args, **kwargs)
            self._trainrun_set = process_set

        if _KERAS2:
            def _calculate_mean_and_var(self, x, axes, keep_dims, mask=None):
                if mask is not None:
                    raise NotImplementedError("SyncBatchNormalization with a mask is not supported by trainrun")
                return global_moments(x, axes, keep_dims, self._trainrun_set)
        else:  # Keras 3
            def _moments(self, inputs, mask):
                if mask is not None:
                    raise NotImplementedError("SyncBatchNormalization with a mask is not supported by trainrun")
                return global_moments(inputs, self._reduction_axes, False, self._trainrun_set)

    SyncBatchNormalization.__module__ = __name__
    return SyncBatchNormalization


SyncBatchNormalization = _make_class()
