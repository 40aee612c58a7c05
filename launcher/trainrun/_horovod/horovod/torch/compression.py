"""horovod.torch.compression: trainrun.torch.compression"""
from .._trainrun import reexport

reexport(__name__, "trainrun.torch.compression")
