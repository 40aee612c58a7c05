"""horovod.tensorflow.elastic: trainrun.tensorflow.elastic"""
from .._trainrun import reexport

reexport(__name__, "trainrun.tensorflow.elastic")
