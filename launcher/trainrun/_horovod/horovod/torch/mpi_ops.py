"""horovod.torch.mpi_ops: trainrun.torch.mpi_ops"""
from .._trainrun import reexport

reexport(__name__, "trainrun.torch.mpi_ops")
