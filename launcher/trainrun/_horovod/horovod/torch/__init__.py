"""horovod.torch: trainrun.torch"""
from .._trainrun import reexport

reexport(__name__, "trainrun.torch", probes=True)
