"""horovod.tensorflow.elastic: trainrun.tensorflow.elastic"""
from horovod._trainrun import reexport

reexport(__name__, "trainrun.tensorflow.elastic")
