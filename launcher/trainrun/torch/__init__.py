"""Horovod's PyTorch API on trainrun: `import trainrun.torch as hvd` in a Horovod script.

init/shutdown/topology come from the framework-free runtime; ops (mpi_ops.py), model/optimizer
helpers (functions.py), DistributedOptimizer (optimizer.py) and Compression are torch-specific.
"""
from types import ModuleType as _ModuleType

from trainrun.runtime.exceptions import HorovodInternalError, StallError, TensorMismatchError
from trainrun.runtime.process_sets import ProcessSet
from trainrun.runtime.lifecycle import (add_process_set, ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                                    gloo_built, gloo_enabled, init, is_homogeneous, is_initialized, local_rank,
                                    local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built,
                                    process_sets, rank, remove_process_set, rocm_built, shutdown, size,
                                    start_timeline, stop_timeline)
from trainrun.torch.compression import Compression
from trainrun.torch.functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                                      broadcast_parameters)
from trainrun.torch.mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async,
                                    allreduce, allreduce_, allreduce_async, allreduce_async_, alltoall,
                                    alltoall_async, barrier, broadcast, broadcast_, broadcast_async,
                                    broadcast_async_, global_process_set, grouped_allgather,
                                    grouped_allgather_async, grouped_allreduce, grouped_allreduce_,
                                    grouped_allreduce_async, grouped_allreduce_async_, grouped_reducescatter,
                                    grouped_reducescatter_async, join, poll, reducescatter, reducescatter_async,
                                    sparse_allreduce_async, synchronize)
from trainrun.torch.optimizer import DistributedOptimizer
from trainrun.torch.sync_batch_norm import SyncBatchNorm

__all__ = [n for n, v in globals().items() if not n.startswith("_") and not isinstance(v, _ModuleType)]


def __getattr__(name):
    """`hvd.elastic` without importing it (and what it needs) with every `import trainrun.torch`."""
    if name == "elastic":
        import importlib
        try:
            return importlib.import_module("trainrun.torch.elastic")
        except ModuleNotFoundError as e:
            if e.name != "trainrun.torch.elastic":
                raise
            raise AttributeError("trainrun.torch.elastic is not part of this trainrun build") from None
    raise AttributeError(f"module 'trainrun.torch' has no attribute {name!r}")
