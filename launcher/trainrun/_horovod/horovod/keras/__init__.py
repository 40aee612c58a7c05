"""horovod.keras: trainrun.keras"""
from .._trainrun import reexport

reexport(__name__, "trainrun.keras", probes=True)
