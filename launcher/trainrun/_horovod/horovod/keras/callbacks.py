"""horovod.keras.callbacks: trainrun.keras.callbacks"""
from .._trainrun import reexport

reexport(__name__, "trainrun.keras.callbacks")
