"""DistributedOptimizer and load_model of horovod.keras for Keras 3 (torch or tensorflow backend);
the machinery is trainrun.keras_common.optimizer's."""
from __future__ import annotations

import keras

from trainrun.keras_common import optimizer as _impl
from trainrun.keras.ops import binding
from trainrun.runtime.ops import Average


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=None,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0,
                         groups=None, process_set=None):
    """A copy of `optimizer` (a keras.optimizers.Optimizer) whose updates use gradients reduced over
    all ranks (see trainrun.keras_common.optimizer). `device_*` are accepted and ignored; `num_groups`/`groups`
    are accepted: all gradients always travel as one group."""
    return _impl.create_distributed_optimizer(keras, binding, optimizer, name, compression or binding.Compression.none,
                                              sparse_as_dense, gradient_predivide_factor, op,
                                              backward_passes_per_step, average_aggregated_gradients, process_set)


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=None,
                                sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average, groups=None,
                                process_set=None, local_layers=None, scale_local_gradients=True):
    """DistributedOptimizer whose gradients of `local_layers`' trainable weights (a keras.layers.Layer or a list
    of them) are not reduced: each rank keeps its own, divided by the size with `scale_local_gradients`
    (Horovod's). `register_local_var(v)` on the result keeps another variable's gradient local too."""
    return _impl.create_distributed_optimizer(keras, binding, optimizer, name, compression or binding.Compression.none,
                                              sparse_as_dense, gradient_predivide_factor, op, 1, False, process_set,
                                              local_layers, scale_local_gradients)


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=None):
    """keras.models.load_model, with the saved optimizer (and its state) restored as a distributed one."""
    return _impl.load_model(keras, binding, filepath, custom_optimizers, custom_objects, compression)


__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "load_model"]
