"""horovod.torch.sync_batch_norm: trainrun.torch.sync_batch_norm"""
from .._trainrun import reexport

reexport(__name__, "trainrun.torch.sync_batch_norm")
