"""trainrun on Spark: `trainrun.run(func, spark=...)` and `horovod.spark.run` (driver.py, in the Spark driver),
and the barrier task that hosts a host's agent (task.py, in the executors)."""
