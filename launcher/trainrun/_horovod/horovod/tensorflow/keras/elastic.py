"""horovod.tensorflow.keras.elastic: trainrun.tensorflow.keras.elastic"""
from ..._trainrun import reexport

reexport(__name__, "trainrun.tensorflow.keras.elastic")
