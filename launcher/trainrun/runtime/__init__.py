"""trainrun's framework-free runtime: Horovod's API on NumPy arrays (`import trainrun.runtime as hvd`).

Modules: topology (where this rank is), engine (background negotiation and ordering), rounds and
cache (agreement on repeated ops), negotiation (the coordinator), collectives + fusion (NumPy work
around MPI calls), backends/ (mpi, nccl), timeline (Chrome trace), state (init, process sets,
handles), process_sets, requests (validation), api (this surface).
"""
from trainrun.runtime.api import (allgather, allgather_async, allgather_object, allreduce, allreduce_,
                                  allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier,
                                  broadcast, broadcast_, broadcast_async, broadcast_async_, broadcast_object,
                                  grouped_allreduce, grouped_allreduce_async, join, reducescatter,
                                  reducescatter_async)
from trainrun.runtime.exceptions import HorovodInternalError, StallError, TensorMismatchError
from trainrun.runtime.ops import Adasum, Average, Max, Min, Product, Sum
from trainrun.runtime.process_sets import ProcessSet, global_process_set
from trainrun.runtime.state import (add_process_set, cross_rank, cross_size, cuda_built, gloo_built,
                                    gloo_enabled, init, is_homogeneous, is_initialized, local_rank,
                                    local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built,
                                    poll, process_sets, rank, remove_process_set, rocm_built, shutdown, size,
                                    synchronize)

__all__ = [n for n in dir() if not n.startswith("_")]
