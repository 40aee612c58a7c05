"""`horovod.runner`: Horovod's programmatic launch, `from horovod.runner import run` (what `horovod.run` is):
trainrun.runfunc.horovod.run, Horovod 0.28.1's signature over trainrun.supervisor."""
from trainrun.runfunc.horovod import run

__all__ = ["run"]
