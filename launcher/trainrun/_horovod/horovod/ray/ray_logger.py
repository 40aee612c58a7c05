"""horovod.ray.ray_logger: trainrun.rayexec.ray_logger"""
from .._trainrun import reexport

reexport(__name__, "trainrun.rayexec.ray_logger")
