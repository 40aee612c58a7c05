"""Horovod's TensorFlow API on trainrun: `import trainrun.tensorflow as hvd` in a Horovod script.

init/shutdown/topology come from the framework-free runtime; collectives on tensors (mpi_ops.py,
eagerly and in graphs, with gradients), variable/object helpers and the TF1 session hook
(functions.py), DistributedOptimizer and DistributedGradientTape (optimizer.py) and Compression are
TensorFlow-specific. Keras: trainrun.tensorflow.keras.
"""
from trainrun.runtime.exceptions import HorovodInternalError, StallError, TensorMismatchError
from trainrun.runtime.process_sets import ProcessSet, global_process_set
from trainrun.runtime.ops import handle_average_backwards_compatibility
from trainrun.runtime.lifecycle import (add_process_set, cross_rank, cross_size, cuda_built, gloo_built,
                                    gloo_enabled, init, is_homogeneous, is_initialized, local_rank,
                                    local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built,
                                    poll, process_sets, rank, remove_process_set, rocm_built, shutdown, size,
                                    start_timeline, stop_timeline, synchronize)
from trainrun.tensorflow.compression import Compression
from trainrun.tensorflow.functions import (BroadcastGlobalVariablesHook, allgather_object, broadcast_,
                                           broadcast_global_variables, broadcast_object, broadcast_object_fn,
                                           broadcast_variables)
from trainrun.tensorflow.mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allreduce, alltoall,
                                         barrier, broadcast, ccl_built, ddl_built, grouped_allgather,
                                         grouped_allreduce, grouped_reducescatter, join, local_rank_op,
                                         local_size_op, process_set_included_op, rank_op, reducescatter, size_op)
from trainrun.tensorflow.optimizer import DistributedGradientTape, DistributedOptimizer, PartialDistributedGradientTape


def check_num_rank_power_of_2(num_rank: int) -> bool:
    """Whether `num_rank` is a power of 2 (Horovod's helper)."""
    return num_rank > 0 and num_rank & (num_rank - 1) == 0


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """False: trainrun's TensorFlow ops run on the CPU (GPU tensors are staged through host memory)."""
    return False


def support_non_legacy_keras_optimizers(k) -> bool:
    """Whether `k` (a Keras module) has the optimizer API of TF >= 2.11 (Horovod's helper)."""
    return hasattr(k.optimizers, "Optimizer") and not hasattr(k.optimizers.Optimizer, "get_updates")


class LocalGradientAggregationHelper:
    """Horovod's internal helper for backward_passes_per_step; trainrun aggregates inside
    DistributedOptimizer / DistributedGradientTape instead."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError("LocalGradientAggregationHelper is Horovod's internal helper; with trainrun pass "
                                  "backward_passes_per_step to hvd.DistributedOptimizer instead")

__all__ = [n for n in dir() if not n.startswith("_")] + ["SyncBatchNormalization", "elastic"]


def __getattr__(name):
    """`hvd.elastic` (trainrun.tensorflow.elastic) without importing it with every import of this module."""
    if name == "elastic":
        import importlib

        return importlib.import_module("trainrun.tensorflow.elastic")
    if name == "SyncBatchNormalization":  # (imports Keras)
        from trainrun.tensorflow.sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
