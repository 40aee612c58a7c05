"""horovod.torch.optimizer: trainrun.torch.optimizer"""
from .._trainrun import reexport

reexport(__name__, "trainrun.torch.optimizer")
