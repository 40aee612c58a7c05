"""horovod.torch.compression: trainrun.torch.compression"""
from horovod._trainrun import reexport

reexport(__name__, "trainrun.torch.compression")
