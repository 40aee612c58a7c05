"""horovod.tensorflow: trainrun.tensorflow"""
from horovod._trainrun import reexport

reexport(__name__, "trainrun.tensorflow", probes=True)
