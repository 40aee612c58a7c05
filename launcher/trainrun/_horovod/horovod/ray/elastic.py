"""horovod.ray.elastic: the deprecated ElasticRayExecutor (Horovod 0.25), over trainrun's elastic launch."""
from . import ElasticRayExecutor

__all__ = ["ElasticRayExecutor"]
