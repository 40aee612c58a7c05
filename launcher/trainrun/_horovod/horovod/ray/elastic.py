"""horovod.ray.elastic: the deprecated ElasticRayExecutor (Horovod 0.25), over trainrun's elastic launch."""
from trainrun.rayexec.horovod_api import ElasticRayExecutor

__all__ = ["ElasticRayExecutor"]
