"""horovod.torch.elastic.state: trainrun.torch.elastic"""
from horovod._trainrun import reexport

reexport(__name__, "trainrun.torch.elastic")
