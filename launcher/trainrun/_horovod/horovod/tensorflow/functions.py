"""horovod.tensorflow.functions: trainrun.tensorflow.functions"""
from .._trainrun import reexport

reexport(__name__, "trainrun.tensorflow.functions")
