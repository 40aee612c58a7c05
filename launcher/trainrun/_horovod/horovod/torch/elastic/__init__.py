"""horovod.torch.elastic: trainrun.torch.elastic"""
from ..._trainrun import reexport

reexport(__name__, "trainrun.torch.elastic")
