"""horovod.tensorflow.keras.callbacks: trainrun.tensorflow.keras.callbacks"""
from ..._trainrun import reexport

reexport(__name__, "trainrun.tensorflow.keras.callbacks")
