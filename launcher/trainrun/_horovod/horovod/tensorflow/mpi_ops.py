"""horovod.tensorflow.mpi_ops: trainrun.tensorflow.mpi_ops"""
from .._trainrun import reexport

reexport(__name__, "trainrun.tensorflow.mpi_ops")
