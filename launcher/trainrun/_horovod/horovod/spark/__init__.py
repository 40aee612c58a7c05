"""`horovod.spark`: `run` and `run_elastic` with Horovod 0.28.1's signatures (trainrun.runfunc.horovod_spark): the
function on Spark barrier tasks, through trainrun. Not here: horovod.spark.torch/keras/lightning's Estimators
and horovod.spark.common (Petastorm stores)."""
from trainrun.runfunc.horovod_spark import run, run_elastic

__all__ = ["run", "run_elastic"]
