"""horovod.torch.functions: trainrun.torch.functions"""
from horovod._trainrun import reexport

reexport(__name__, "trainrun.torch.functions")
