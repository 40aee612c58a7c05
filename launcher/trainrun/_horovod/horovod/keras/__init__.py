"""horovod.keras: trainrun.keras"""
from horovod._trainrun import reexport

reexport(__name__, "trainrun.keras", probes=True)
