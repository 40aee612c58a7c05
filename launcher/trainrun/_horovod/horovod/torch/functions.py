"""horovod.torch.functions: trainrun.torch.functions"""
from .._trainrun import reexport

reexport(__name__, "trainrun.torch.functions")
