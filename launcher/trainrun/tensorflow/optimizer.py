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
from trainrun.tensorflow.mpi_ops import _set_rank
from trainrun.tensorflow.reduce import grads_name, reduce_gradients


def _check(op, gradient_predivide_factor, groups, num_groups):
    if op == Adasum:
        raise NotImplementedError("op=Adasum is not supported by trainrun; use Average or Sum")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """A tf.compat.v1 optimizer whose compute_gradients returns gradients reduced over ranks.

    With backward_passes_per_step=k (graph mode, as Horovod's LocalGradientAggregationHelper): each
    run of the training op adds its gradients to accumulator variables; every k-th run reduces the
    accumulated gradients (averaged over the k passes if average_aggregated_gradients) and applies
    them, then zeroes the accumulators; the other runs apply nothing but still advance global_step."""

    def __init__(self, optimizer, name, use_locking, compression, sparse_as_dense, op, gradient_predivide_factor,
                 process_set, passes=1, average_aggregated=False):
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)
        self._optimizer = optimizer
        self._reduce = dict(compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                            gradient_predivide_factor=gradient_predivide_factor, process_set=process_set)
        self._passes, self._average_aggregated = passes, average_aggregated
        self._accumulation = None  # (accumulators, counter, is-update-step tensor) of the last compute_gradients

    def compute_gradients(self, *args, **kwargs):
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        name = grads_name(self.get_name(), variables)
        if self._passes == 1:
            return list(zip(reduce_gradients(grads, variables, name=name, **self._reduce), variables))
        with tf.compat.v1.variable_scope(None, default_name="trainrun_accumulation"):
            accs = [None if g is None else tf.compat.v1.get_variable(
                        f"acc{i}", v.shape, v.dtype.base_dtype, tf.compat.v1.zeros_initializer(), trainable=False)
                    for i, (g, v) in enumerate(zip(grads, variables))]
            counter = tf.compat.v1.get_variable("passes", [], tf.int64, tf.compat.v1.zeros_initializer(),
                                                trainable=False)
        adds = [a.assign_add(tf.convert_to_tensor(g)) for a, g in zip(accs, grads) if a is not None]
        with tf.control_dependencies(adds):
            is_update = tf.equal(counter.assign_add(1), self._passes)
        live = [i for i, a in enumerate(accs) if a is not None]
        scale = 1.0 / self._passes if self._average_aggregated else 1.0

        def reduce():
            values = [accs[i].read_value() * scale if scale != 1.0 else accs[i].read_value() for i in live]
            return reduce_gradients(values, [variables[i] for i in live], name=name, **self._reduce)

        out = tf.cond(is_update, reduce, lambda: [accs[i].read_value() for i in live])
        self._accumulation = (accs, counter, is_update)
        merged = dict(zip(live, out if isinstance(out, (list, tuple)) else [out]))
        return [(merged.get(i), v) for i, v in enumerate(variables)]

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        if self._passes == 1:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        if self._accumulation is None:
            raise ValueError("backward_passes_per_step > 1: call compute_gradients (or minimize) of the "
                             "DistributedOptimizer before apply_gradients")
        accs, counter, is_update = self._accumulation
        grads_and_vars = list(grads_and_vars)

        def apply():
            op = self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
            with tf.control_dependencies([op]):
                resets = [a.assign(tf.zeros_like(a)) for a in accs if a is not None] + [counter.assign(0)]
            with tf.control_dependencies(resets):
                return tf.constant(True)

        def skip():
            deps = [] if global_step is None else [tf.compat.v1.assign_add(global_step, 1)]
            with tf.control_dependencies(deps):
                return tf.constant(False)

        return tf.group(tf.cond(is_update, apply, skip))

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
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be a positive integer, got {backward_passes_per_step!r}")
        if backward_passes_per_step > 1 and tf.executing_eagerly():
            raise ValueError("backward_passes_per_step > 1 with a tf.compat.v1 optimizer works in graph mode "
                             "(a tf.compat.v1 Graph/Session), as in Horovod")
        return _DistributedOptimizer(optimizer, name, use_locking, compression, sparse_as_dense, op,
                                     gradient_predivide_factor, process_set, backward_passes_per_step,
                                     average_aggregated_gradients)
    # a Keras optimizer: the same wrapper trainrun.tensorflow.keras.DistributedOptimizer makes
    from trainrun.keras_common import optimizer as keras_impl
    from trainrun.keras_common.collectives import for_backend

    return keras_impl.create_distributed_optimizer(tf.keras, for_backend("tensorflow"), optimizer, name, compression, sparse_as_dense,
                                                   gradient_predivide_factor, op, backward_passes_per_step,
                                                   average_aggregated_gradients, process_set)


class _DistributedGradientTape:
    """Mixed in before the user's tape class: gradient() reduces what the tape computed, except the
    gradients of sources registered as local (register_local_source, PartialDistributedGradientTape),
    which stay this rank's own (divided by the set size with scale_local_gradients, as Horovod)."""

    _trainrun_local: set[int]  # ids of the local sources, set where the tape is made (below)

    def register_local_source(self, source) -> None:
        """Keep `source`'s gradient on this rank (no collective for it)."""
        self._trainrun_local.add(id(source))  # (Keras 3 variables have no .ref(); a registered source lives on)

    @tf.autograph.experimental.do_not_convert  # plain Python over the sources (autograph breaks super())
    def gradient(self, target, sources, output_gradients=None, use_generic_names=False, **kwargs):
        # (use_generic_names: Horovod's choice of op names; the names here are the variables' either way)
        grads = super(_DistributedGradientTape, self).gradient(target, sources, output_gradients, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads)
        local = self._trainrun_local
        shared = [i for i, s in enumerate(flat_sources) if id(s) not in local]
        reduced = reduce_gradients([flat_grads[i] for i in shared], [flat_sources[i] for i in shared],
                                   name=grads_name("DistributedGradientTape", [flat_sources[i] for i in shared]),
                                   **self._trainrun)
        out = list(flat_grads)
        for i, g in zip(shared, reduced):
            out[i] = g
        if local and self._trainrun_scale_local:
            n = _set_rank(self._trainrun["process_set"])[1]
            for i, s in enumerate(flat_sources):
                g = out[i]
                if id(s) in local and g is not None:
                    out[i] = tf.IndexedSlices(g.values / n, g.indices, g.dense_shape) \
                        if isinstance(g, tf.IndexedSlices) else g / n
        return tf.nest.pack_sequence_as(grads, out)

    @tf.autograph.experimental.do_not_convert
    def get_local_and_global_gradients(self, target, sources, output_gradients=None, use_generic_names=False):
        """gradient(), split as Horovod's: ([(source, gradient) of the registered local sources],
        [(source, gradient) of the others, reduced over the ranks]), each in the sources' order."""
        grads = self.gradient(target, sources, output_gradients)
        local, shared = [], []
        for s, g in zip(tf.nest.flatten(sources), tf.nest.flatten(grads)):
            (local if id(s) in self._trainrun_local else shared).append((s, g))
        return local, shared


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
    tape._trainrun_local, tape._trainrun_scale_local = set(), scale_local_gradients
    return tape


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                                   sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set, local_layers=None,
                                   scale_local_gradients=True):
    """DistributedGradientTape whose gradients of `local_layers`' trainable weights (a Keras layer or a
    list of them) stay local, as Horovod's."""
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    if not all(hasattr(layer, "trainable_weights") for layer in local_layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients)
    for layer in local_layers:
        for v in layer.trainable_weights:
            tape.register_local_source(v)
    return tape
