"""A Horovod RayExecutor driver (horovod.ray's API as Horovod 0.28.1's examples and docs use it), unchanged:
create_settings, start(executable_cls=...), run, execute, execute_single, run_remote, ray_logger callbacks,
a rank's exception, shutdown. Prints one JSON line per step ("STEP name value") for the test to check.
Usage: python executor_calls.py [--address ADDRESS] [--num-workers N] [--num-hosts H]"""
import argparse
import json
import os
import socket
import time

import ray

from horovod.ray import RayExecutor, ray_logger

parser = argparse.ArgumentParser()
parser.add_argument("--address", default=None)
parser.add_argument("--num-workers", type=int, default=2)
parser.add_argument("--num-hosts", type=int, default=None)
args = parser.parse_args()


def say(name, value):
    print("STEP", json.dumps([name, value]), flush=True)


class Counter:
    """The executable_cls: one per worker, kept between calls."""

    def __init__(self, step):
        self.step = step
        self.total = 0
        self.pid = os.getpid()

    def add(self):
        self.total += self.step
        return self.total


def allreduce_ranks(offset):
    import horovod.torch as hvd
    import torch

    hvd.init()
    summed = hvd.allreduce(torch.tensor([float(hvd.rank() + offset)]), op=hvd.Sum)
    ray_logger.log({"rank": hvd.rank(), "sum": summed.item()})
    return [hvd.rank(), hvd.size(), hvd.local_rank(), summed.item(), socket.gethostname(), os.getpid()]


def the_same_world_again():
    import horovod.torch as hvd
    import torch

    hvd.init()  # already initialized in this process by the call before: the same world
    return hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()


class Broken:
    """An executable_cls whose constructor fails on one worker."""

    def __init__(self):
        if int(os.environ["RANK"]) == 0:
            raise RuntimeError("no device here")


def dies_on_rank_1():
    if int(os.environ["RANK"]) == 1:
        os._exit(9)  # a worker gone without a word (killed, its node lost)
    time.sleep(600)  # the others would wait for it in a collective


def fails_on_rank_1():
    if int(os.environ["RANK"]) == 1:
        raise ValueError("bad shard on this worker")
    return "fine"


if __name__ == "__main__":
    ray.init(address=args.address, logging_level="ERROR")
    settings = RayExecutor.create_settings(timeout_s=60)
    if args.num_hosts:
        executor = RayExecutor(settings, num_hosts=args.num_hosts, num_workers_per_host=1, cpus_per_worker=1)
    else:
        executor = RayExecutor(settings, num_workers=args.num_workers, cpus_per_worker=1, use_gpu=False)
    t0 = time.monotonic()
    executor.start(executable_cls=Counter, executable_args=[10], extra_env_vars={"MY_SETTING": "on"})
    say("start_s", time.monotonic() - t0)
    logged = []
    t0 = time.monotonic()
    say("run", executor.run(allreduce_ranks, args=[100], callbacks=[logged.append]))
    say("run_s", time.monotonic() - t0)
    say("logged", sorted(logged, key=lambda r: r["rank"]))
    say("again", executor.run(the_same_world_again))
    say("env", executor.run(lambda: os.environ.get("MY_SETTING")))
    say("execute", executor.execute(lambda w: [w.add(), w.pid]))
    say("execute2", executor.execute(lambda w: w.add()))
    say("single", executor.execute_single(lambda w: w.add()))
    refs = executor.run_remote(allreduce_ranks, kwargs={"offset": 1})
    say("remote_types", [type(r).__name__ for r in refs])
    say("remote", ray.get(refs))
    try:
        executor.run(fails_on_rank_1)
        say("error", None)
    except Exception as err:  # trainrun.RankError
        say("error", [type(err).__name__, getattr(err, "rank", None), type(getattr(err, "exception", None)).__name__,
                      str(err).splitlines()[0]])
    try:
        executor.run(fails_on_rank_1)
    except Exception as err:
        say("after_error", [type(err).__name__, str(err).splitlines()[0]])
    executor.shutdown()
    executor.start()  # the same executor again, fresh workers
    t0 = time.monotonic()
    try:
        executor.run(dies_on_rank_1)
        say("died", None)
    except Exception as err:  # trainrun.RunError, not a hang
        say("died", [type(err).__name__, str(err).splitlines()[0]])
    say("died_s", time.monotonic() - t0)
    executor.shutdown()
    try:
        executor.start(executable_cls=Broken)
        say("broken", None)
    except Exception as err:  # the constructor's error, from start()
        say("broken", [type(err).__name__, getattr(err, "rank", None), str(err).splitlines()[0]])
    executor.shutdown()
    from ray.util import list_named_actors

    say("actors_left", list_named_actors(all_namespaces=True))
    say("done", True)
