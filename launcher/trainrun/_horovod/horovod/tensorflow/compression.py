"""horovod.tensorflow.compression: trainrun.tensorflow.compression"""
from horovod._trainrun import reexport

reexport(__name__, "trainrun.tensorflow.compression")
