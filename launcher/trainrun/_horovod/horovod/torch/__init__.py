"""horovod.torch: trainrun.torch"""
from horovod._trainrun import reexport

reexport(__name__, "trainrun.torch", probes=True)
