"""A RayExecutor driver that gets killed: it starts 2 workers, says STARTED, and waits in a long run() call.
The test SIGKILLs it there; nothing of it may be left (its launcher, ranks, the Ray cluster it started)."""
import time

import ray

from horovod.ray import RayExecutor


def wait_long():
    import horovod.torch as hvd

    hvd.init()
    time.sleep(600)


if __name__ == "__main__":
    ray.init(logging_level="ERROR")
    executor = RayExecutor(RayExecutor.create_settings(), num_workers=2)
    executor.start()
    print("STARTED", flush=True)
    executor.run(wait_long)
