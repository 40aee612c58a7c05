"""horovod.torch.optimizer: trainrun.torch.optimizer"""
from horovod._trainrun import reexport

reexport(__name__, "trainrun.torch.optimizer")
