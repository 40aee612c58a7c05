"""Horovod's TensorFlow API on trainrun: `import trainrun.tensorflow as hvd` in a Horovod script.

init/shutdown/topology come from the framework-free runtime; collectives on tensors (mpi_ops.py,
eagerly and in graphs, with gradients), variable/object helpers and the TF1 session hook
(functions.py), DistributedOptimizer and DistributedGradientTape (optimizer.py) and Compression are
TensorFlow-specific. Keras: trainrun.tensorflow.keras.
"""
from trainrun.runtime.exceptions import HorovodInternalError, StallError, TensorMismatchError
from trainrun.runtime.process_sets import ProcessSet, global_process_set
from trainrun.runtime.state import (add_process_set, cross_rank, cross_size, cuda_built, gloo_built,
                                    gloo_enabled, init, is_homogeneous, is_initialized, local_rank,
                                    local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built,
                                    poll, process_sets, rank, remove_process_set, rocm_built, shutdown, size,
                                    synchronize)
from trainrun.tensorflow.compression import Compression
from trainrun.tensorflow.functions import (BroadcastGlobalVariablesHook, allgather_object, broadcast_global_variables,
                                           broadcast_object, broadcast_variables)
from trainrun.tensorflow.mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allreduce, alltoall,
                                         barrier, broadcast, grouped_allreduce, join, local_rank_op, local_size_op,
                                         rank_op, reducescatter, size_op)
from trainrun.tensorflow.optimizer import DistributedGradientTape, DistributedOptimizer

__all__ = [n for n in dir() if not n.startswith("_")]


def __getattr__(name):
    """`hvd.elastic` (trainrun.tensorflow.elastic) without importing it with every import of this module."""
    if name == "elastic":
        import importlib

        return importlib.import_module("trainrun.tensorflow.elastic")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
