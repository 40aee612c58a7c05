"""horovod.ray: trainrun.rayexec.horovod_api (Horovod 0.28.1's RayExecutor over trainrun's Ray engine)"""
from .._trainrun import reexport

reexport(__name__, "trainrun.rayexec.horovod_api")
