"""horovod.torch.mpi_ops: trainrun.torch.mpi_ops"""
from horovod._trainrun import reexport

reexport(__name__, "trainrun.torch.mpi_ops")
