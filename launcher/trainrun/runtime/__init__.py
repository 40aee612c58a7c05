"""trainrun's framework-free runtime: Horovod's API on NumPy arrays (`import trainrun.runtime as hvd`).

Modules, from the surface down:
- api (this surface on NumPy arrays), requests (argument checks, Request builders, op names),
  lifecycle (init/shutdown, topology queries, handles: thin accessors over context), process_sets
  (ProcessSet and the registry of sets), context (the runtime's state in one object: RUNTIME),
  handles (the int handle table), topology (where this rank is).
- engine (one per process set: submit, run, wait, shutdown; its background thread), driver (the
  agreement loop: rounds, phases, running responses), lone (the lone-op path of a blocking op),
  completion (finishing handles), timing (the polling policy).
- rounds (a round's wire format), cache (the response cache), negotiation (rank 0's coordinator),
  messages (the NamedTuples ranks exchange: Meta, Response, JoinedInfo, OpFailure).
- ops (op constants, Request, Handle, shared rules), fusion (wire dtypes, the fusion rule, buffers),
  collectives (NumPy work around the backend), adasum (op=Adasum's combination), backends/ (mpi,
  nccl), timeline (Chrome trace), exceptions.
"""
from types import ModuleType as _ModuleType

from trainrun.runtime.api import (allgather, allgather_async, allgather_object, allreduce, allreduce_,
                                  allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier,
                                  broadcast, broadcast_, broadcast_async, broadcast_async_, broadcast_object,
                                  grouped_allreduce, grouped_allreduce_async, join, reducescatter,
                                  reducescatter_async)
from trainrun.runtime.exceptions import HorovodInternalError, StallError, TensorMismatchError
from trainrun.runtime.ops import Adasum, Average, Max, Min, Product, Sum
from trainrun.runtime.process_sets import ProcessSet, global_process_set
from trainrun.runtime.lifecycle import (add_process_set, cross_rank, cross_size, cuda_built, gloo_built,
                                    gloo_enabled, init, is_homogeneous, is_initialized, local_rank,
                                    local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built,
                                    poll, process_sets, rank, remove_process_set, rocm_built, shutdown, size,
                                    synchronize)

__all__ = [n for n, v in globals().items() if not n.startswith("_") and not isinstance(v, _ModuleType)]
