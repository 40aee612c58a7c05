"""horovod.tensorflow.keras: trainrun.tensorflow.keras"""
from ..._trainrun import reexport

reexport(__name__, "trainrun.tensorflow.keras", probes=True)
