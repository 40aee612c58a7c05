"""horovod.tensorflow.functions: trainrun.tensorflow.functions"""
from horovod._trainrun import reexport

reexport(__name__, "trainrun.tensorflow.functions")
