"""horovod.torch.elastic.sampler: trainrun.torch.sampler"""
from ..._trainrun import reexport

reexport(__name__, "trainrun.torch.sampler")
