"""horovod.tensorflow.compression: trainrun.tensorflow.compression"""
from .._trainrun import reexport

reexport(__name__, "trainrun.tensorflow.compression")
