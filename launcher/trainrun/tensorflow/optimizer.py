"""DistributedOptimizer and DistributedGradientTape of horovod.tensorflow: average gradients over ranks.

Dense gradients travel as one grouped allreduce (one negotiation, one fused reduction per dtype),
named after the variables, so the name is the same every step; `tf.IndexedSlices` are allgathered
(or densified first with `sparse_as_dense=True`). Works eagerly, in `tf.function` and in TF1 graphs
(tf.compat.v1 optimizers' `compute_gradients`). Keras optimizers passed to DistributedOptimizer get
trainrun.tensorflow.keras's DistributedOptimizer, as in Horovod.
"""
from __future__ import annotations

import tensorflow as tf

from trainrun.runtime.ops import Adasum, Average
from trainrun.runtime.process_sets import global_process_set
from trainrun.tensorflow.compression import Compression
from trainrun.tensorflow.reduce import grads_name, reduce_gradients


def _check(op, gradient_predivide_factor, groups, num_groups):
    if op == Adasum:
        raise NotImplementedError("op=Adasum is not supported by trainrun; use Average or Sum")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """A tf.compat.v1 optimizer whose compute_gradients returns gradients reduced over ranks."""

    def __init__(self, optimizer, name, use_locking, compression, sparse_as_dense, op, gradient_predivide_factor,
                 process_set):
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)
        self._optimizer = optimizer
        self._reduce = dict(compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                            gradient_predivide_factor=gradient_predivide_factor, process_set=process_set)

    def compute_gradients(self, *args, **kwargs):
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        reduced = reduce_gradients(grads, variables, name=grads_name(self.get_name(), variables), **self._reduce)
        return list(zip(reduced, variables))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set):
    """Wrap a tf.compat.v1.train.Optimizer (graph mode) or a Keras optimizer so that it applies
    gradients averaged (or summed: `op`) over ranks. `device_*`, `num_groups` and `groups` are
    accepted and ignored (CPU tensors; all gradients travel as one group)."""
    _check(op, gradient_predivide_factor, groups, num_groups)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if backward_passes_per_step != 1:
            raise NotImplementedError("backward_passes_per_step > 1 is not supported by trainrun for "
                                      "tf.compat.v1 optimizers; accumulate gradients in the training loop")
        return _DistributedOptimizer(optimizer, name, use_locking, compression, sparse_as_dense, op,
                                     gradient_predivide_factor, process_set)
    # a Keras optimizer: the same wrapper trainrun.tensorflow.keras.DistributedOptimizer makes
    from trainrun._keras import optimizer as keras_impl
    from trainrun._keras import tf_ops

    return keras_impl.create_distributed_optimizer(tf.keras, tf_ops, optimizer, name, compression, sparse_as_dense,
                                                   gradient_predivide_factor, op, backward_passes_per_step,
                                                   average_aggregated_gradients, process_set)


class _DistributedGradientTape:
    """Mixed in before the user's tape class: gradient() reduces what the tape computed."""

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = super().gradient(target, sources, output_gradients, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        reduced = reduce_gradients(tf.nest.flatten(grads), flat_sources,
                                   name=grads_name("DistributedGradientTape", flat_sources), **self._trainrun)
        return tf.nest.pack_sequence_as(grads, reduced)


_TAPE_CLASSES: dict = {}


def DistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                            sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=global_process_set, scale_local_gradients=True):
    """A tape that records what `gradtape` recorded and whose gradient() returns gradients reduced over
    ranks. Use after the `with tf.GradientTape() as tape:` block: `tape = hvd.DistributedGradientTape(tape)`."""
    _check(op, gradient_predivide_factor, groups, num_groups)
    base = type(gradtape)
    cls = _TAPE_CLASSES.get(base)
    if cls is None:
        cls = _TAPE_CLASSES[base] = type(base.__name__, (_DistributedGradientTape, base), {})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)  # the same recording (TF's tape object), persistence, ...
    tape._trainrun = dict(compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                          gradient_predivide_factor=gradient_predivide_factor, process_set=process_set)
    return tape
