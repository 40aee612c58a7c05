"""DistributedOptimizer for Keras (horovod.keras / horovod.tensorflow.keras), on any backend binding.

The wrapped optimizer is a subclass of the original's class made on the fly (as Horovod does), built
from its config. Keras 3: its `apply(grads, variables)` -- what `fit` and `apply_gradients` call --
first reduces the gradients over ranks in one grouped allreduce named after the optimizer and the
variables (so its signature is cached from the second step on). tf-keras (Keras 2): the same in
`apply_gradients(grads_and_vars)`. With `backward_passes_per_step=k` the gradients of k calls
accumulate locally and only every k-th call reduces and applies them (averaged over the k passes if
`average_aggregated_gradients`); the calls in between apply nothing, so `iterations` counts real
updates. Eagerly (and on torch) that accumulation is Python-side; in the tf.function that Keras 3's
`fit` compiles on TensorFlow it is in the graph (collectives' accumulate_in_graph: variables and tf.cond).

`ops` is the backend's collectives.KerasCollectives: reduce_gradients, clone, in_graph, accumulate_in_graph.
"""
from __future__ import annotations

from trainrun.runtime import lifecycle
from trainrun.runtime.ops import Adasum, Average


class _Settings:
    def __init__(self, ops, compression, passes, average_aggregated, op, predivide, sparse_as_dense, process_set):
        self.ops, self.compression, self.passes, self.average_aggregated = ops, compression, passes, average_aggregated
        self.op, self.predivide, self.sparse_as_dense, self.process_set = op, predivide, sparse_as_dense, process_set
        self.name = None          # the grouped allreduce's name, fixed on the first step
        self.accumulated = None   # gradients summed over the passes so far
        self.count = 0
        self.graph = None         # in-graph accumulation's variables (KerasCollectives.accumulate_in_graph)
        self.local: set = set()   # ids of variables whose gradients stay on this rank (register_local_var)
        self.scale_local = True   # divide those by the set size (Horovod's scale_local_gradients)


class _Distributed:
    """Mixed in before the user's optimizer class. `_trainrun_defaults` (a class attribute) holds the
    settings of optimizers built by Keras itself (load_model); DistributedOptimizer sets its own."""

    _trainrun_defaults: tuple = ()

    @property
    def _trainrun(self) -> _Settings:
        s = self.__dict__.get("_trainrun_settings")
        if s is None:
            s = self.__dict__["_trainrun_settings"] = _Settings(*self._trainrun_defaults)
        return s

    def _trainrun_in_graph(self) -> bool:
        """Whether passes accumulate in a graph (a tf.function step) rather than in Python."""
        s = self._trainrun
        return s.passes > 1 and s.ops.accumulate_in_graph is not None and s.ops.in_graph()

    def _trainrun_accumulate(self, grads):
        """grads to apply now, or None while passes are still being accumulated (Python-side)."""
        s = self._trainrun
        if s.passes == 1:
            return grads
        if s.accumulated is None:
            s.accumulated = [None if g is None else s.ops.clone(g) for g in grads]
        else:
            s.accumulated = [a if a is None or g is None else a + g for a, g in zip(s.accumulated, grads)]
        s.count += 1
        if s.count < s.passes:
            return None
        grads, s.accumulated, s.count = s.accumulated, None, 0
        if s.average_aggregated:
            grads = [None if g is None else g / s.passes for g in grads]
        return grads

    def register_local_var(self, var) -> None:
        """Keep `var`'s gradient on this rank: no collective for it (Horovod's PartialDistributedOptimizer)."""
        self._trainrun.local.add(id(var))

    def _trainrun_reduce(self, grads, variables):
        s = self._trainrun
        if s.local and variables is not None:
            return self._trainrun_reduce_partly(list(grads), list(variables))
        if not any(g is not None for g in grads) or lifecycle.engine(s.process_set).size == 1:
            return grads
        if s.name is None:
            paths = list(variables) if variables is not None else [None] * len(grads)
            try:
                own = self.name
            except AttributeError:  # tf-keras' legacy optimizers (OptimizerV2) keep it in _name
                own = self._name
            s.name = "keras.grads." + own + "." + ".".join(
                str(getattr(paths[i], "path", None) or getattr(paths[i], "name", i))
                for i, g in enumerate(grads) if g is not None)
        pre, post = (1.0 / s.predivide, s.predivide) if s.op == Average else (1.0, 1.0)
        return s.ops.reduce_gradients(grads, variables, name=s.name, op=s.op, pre=pre, post=post,
                                      compression=s.compression, sparse_as_dense=s.sparse_as_dense,
                                      process_set=s.process_set)


    def _trainrun_reduce_partly(self, grads, variables):
        """The gradients of shared variables reduced, those of registered local ones kept (over the set
        size with scale_local)."""
        s = self._trainrun
        shared = [i for i, v in enumerate(variables) if id(v) not in s.local]
        out = list(grads)
        s.local, local = set(), s.local  # (the shared ones go through the ordinary path)
        try:
            for i, g in zip(shared, self._trainrun_reduce([grads[i] for i in shared], [variables[i] for i in shared])):
                out[i] = g
        finally:
            s.local = local
        n = lifecycle.engine(s.process_set).size
        if s.scale_local and n > 1:
            for i, v in enumerate(variables):
                if id(v) in local and out[i] is not None:
                    out[i] = out[i] / n
        return out


class _Keras3(_Distributed):
    def apply(self, grads, trainable_variables=None):
        if self._trainrun_in_graph():
            if not self.built:  # (its variables cannot be made inside the tf.cond below)
                self.build(trainable_variables)
            return self._trainrun.ops.accumulate_in_graph(
                self._trainrun, list(grads), lambda gs: super(_Keras3, self).apply(
                    self._trainrun_reduce(gs, trainable_variables), trainable_variables))
        grads = self._trainrun_accumulate(list(grads))
        if grads is None:
            return None
        return super().apply(self._trainrun_reduce(grads, trainable_variables), trainable_variables)


class _Keras2(_Distributed):
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        if self._trainrun_in_graph():
            variables = [v for _, v in pairs]  # (tf-keras builds its variables under tf.init_scope itself)
            return self._trainrun.ops.accumulate_in_graph(
                self._trainrun, [g for g, _ in pairs], lambda gs: super(_Keras2, self).apply_gradients(
                    list(zip(self._trainrun_reduce(gs, variables), variables)), *args, **kwargs))
        grads = self._trainrun_accumulate([g for g, _ in pairs])
        if grads is None:
            return None
        variables = [v for _, v in pairs]
        return super().apply_gradients(list(zip(self._trainrun_reduce(grads, variables), variables)), *args, **kwargs)


def is_tf_keras(optimizer_class) -> bool:
    """Whether the class comes from tf-keras (Keras 2), not Keras 3."""
    return optimizer_class.__module__.split(".")[0] == "tf_keras"


_CLASSES: dict = {}


def distributed_class(cls, defaults: tuple):
    """The distributed subclass of optimizer class `cls` (Keras 3 or tf-keras)."""
    key = (cls, defaults)
    if key not in _CLASSES:
        mixin = _Keras2 if is_tf_keras(cls) else _Keras3
        _CLASSES[key] = type(cls.__name__, (mixin, cls), {"_trainrun_defaults": defaults})
    return _CLASSES[key]


def settings(ops, compression, backward_passes_per_step, average_aggregated_gradients, op,
             gradient_predivide_factor, sparse_as_dense, process_set) -> tuple:
    """Checked DistributedOptimizer arguments, as the tuple _Settings takes."""
    if op == Adasum:
        raise ValueError("op=Adasum is not supported by trainrun; use Average or Sum")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be a positive integer, got {backward_passes_per_step!r}")
    return (ops, compression, backward_passes_per_step, average_aggregated_gradients, op,
            float(gradient_predivide_factor), sparse_as_dense, process_set)


def create_distributed_optimizer(keras, ops, optimizer, name, compression, sparse_as_dense, gradient_predivide_factor,
                                 op, backward_passes_per_step, average_aggregated_gradients, process_set,
                                 local_layers=None, scale_local_gradients=True):
    """A copy of `optimizer` (a `keras.optimizers.Optimizer` of the given keras module) whose updates
    use gradients reduced over all ranks, except those of `local_layers`' trainable weights (a layer or
    a list of them: they stay local, divided by the set size with scale_local_gradients)."""
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    if not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError("All local layers must be of keras.layers.Layer type.")
    distributed = _create(keras, ops, optimizer, name, compression, sparse_as_dense, gradient_predivide_factor, op,
                          backward_passes_per_step, average_aggregated_gradients, process_set)
    distributed._trainrun.scale_local = scale_local_gradients
    for layer in local_layers:
        for v in layer.trainable_weights:
            distributed.register_local_var(v)
    return distributed


def _create(keras, ops, optimizer, name, compression, sparse_as_dense, gradient_predivide_factor, op,
            backward_passes_per_step, average_aggregated_gradients, process_set):
    if not isinstance(optimizer, keras.optimizers.Optimizer) and not _is_legacy(keras, optimizer):
        raise ValueError(f"DistributedOptimizer needs a keras.optimizers.Optimizer, got {type(optimizer).__name__}")
    defaults = settings(ops, compression, backward_passes_per_step, average_aggregated_gradients, op,
                        gradient_predivide_factor, sparse_as_dense, process_set)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    return distributed_class(optimizer.__class__, defaults).from_config(config)


def _is_legacy(keras, optimizer) -> bool:
    legacy = getattr(getattr(keras, "optimizers", None), "legacy", None)
    return legacy is not None and isinstance(optimizer, getattr(legacy, "Optimizer", ()))


def load_model(keras, ops, filepath, custom_optimizers=None, custom_objects=None, compression=None):
    """keras.models.load_model with every built-in optimizer class (and `custom_optimizers`) replaced
    by its distributed subclass, so the restored optimizer -- state included -- is distributed again."""
    defaults = settings(ops, compression or ops.Compression.none, 1, False, Average, 1.0, False, None)
    base = keras.optimizers.Optimizer
    classes = [c for c in vars(keras.optimizers).values()
               if isinstance(c, type) and issubclass(c, base) and c is not base]
    objects = {c.__name__: distributed_class(c, defaults) for c in classes + list(custom_optimizers or [])}
    objects.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=objects)
