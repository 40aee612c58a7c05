"""horovod.tensorflow: trainrun.tensorflow"""
from .._trainrun import reexport

reexport(__name__, "trainrun.tensorflow", probes=True)
