"""Horovod's tf.keras API on trainrun: `import trainrun.tensorflow.keras as hvd`.

Works with whatever `tf.keras` is: Keras 3 on its tensorflow backend (TF 2.21's default; this module
sets KERAS_BACKEND=tensorflow unless it is set), or tf-keras (Keras 2) when the program sets
TF_USE_LEGACY_KERAS=1 before importing TensorFlow. The machinery is trainrun.keras_common's with
TensorFlow collectives (trainrun.keras_common.collectives), so gradients are reduced inside the tf.function
that `fit` compiles.
"""
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402

from trainrun.keras_common import optimizer as _impl  # noqa: E402
from trainrun.keras_common.collectives import for_backend  # noqa: E402
from trainrun.runtime.exceptions import HorovodInternalError, StallError, TensorMismatchError  # noqa: E402
from trainrun.runtime.ops import Average, Max, Min, Product, Sum  # noqa: E402
from trainrun.runtime.process_sets import ProcessSet, global_process_set  # noqa: E402
from trainrun.runtime.lifecycle import (add_process_set, cross_rank, cross_size, cuda_built, gloo_built,  # noqa: E402
                                    gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_size,
                                    mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, process_sets, rank,
                                    remove_process_set, rocm_built, shutdown, size, start_timeline, stop_timeline)
from trainrun.tensorflow.functions import (allgather_object, broadcast_object,  # noqa: E402
                                           broadcast_variables as _tf_broadcast_variables)
from trainrun.tensorflow.mpi_ops import barrier, ccl_built, ddl_built, join  # noqa: E402
from trainrun.tensorflow.compression import Compression  # noqa: E402
from trainrun.tensorflow.keras import callbacks  # noqa: E402

keras = callbacks.keras  # the tf.keras in use (Keras 3 or tf-keras)
_ops = for_backend("tensorflow")
allreduce, allgather, broadcast, reducescatter = _ops.allreduce, _ops.allgather, _ops.broadcast, _ops.reducescatter


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0,
                         groups=None, process_set=global_process_set, local_layers=None,
                         scale_local_gradients=True):
    """A copy of `optimizer` (a tf.keras optimizer) whose updates use gradients reduced over all ranks
    (see trainrun.keras_common.optimizer), except `local_layers`' (kept local; register_local_var adds more).
    `device_*` are accepted and ignored; all gradients travel as one group."""
    return _impl.create_distributed_optimizer(keras, _ops, optimizer, name, compression, sparse_as_dense,
                                              gradient_predivide_factor, op, backward_passes_per_step,
                                              average_aggregated_gradients, process_set, local_layers,
                                              scale_local_gradients)


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False, gradient_predivide_factor=1.0,
                                op=Average, backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """DistributedOptimizer whose gradients of `local_layers`' trainable weights stay local (Horovod's)."""
    return DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                                gradient_predivide_factor, op, backward_passes_per_step, average_aggregated_gradients,
                                groups=groups, process_set=process_set, local_layers=local_layers,
                                scale_local_gradients=scale_local_gradients)


def broadcast_variables(variables, root_rank, process_set=global_process_set):
    """Assign root_rank's values to `variables` on every rank."""
    return _tf_broadcast_variables(variables, root_rank, process_set)


def broadcast_global_variables(root_rank):
    """Eagerly: broadcast the model's variables through BroadcastGlobalVariablesCallback instead (as Horovod)."""
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution; use "
                           "hvd.callbacks.BroadcastGlobalVariablesCallback(0) or hvd.broadcast_variables(...)")
    from trainrun.tensorflow.functions import broadcast_global_variables as graph_broadcast
    return graph_broadcast(root_rank)


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none):
    """tf.keras.models.load_model, with the saved optimizer (and its state) restored as a distributed one."""
    return _impl.load_model(keras, _ops, filepath, custom_optimizers, custom_objects, compression)


__all__ = [n for n in dir() if not n.startswith("_") and n not in ("os", "tf", "keras")]


def __getattr__(name):
    """`hvd.elastic` (trainrun.tensorflow.keras.elastic: Horovod's KerasState and callbacks) without importing
    it with every import of this module."""
    if name == "elastic":
        import importlib

        return importlib.import_module("trainrun.tensorflow.keras.elastic")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
