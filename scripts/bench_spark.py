#!/usr/bin/env python3
"""horovod.spark.run against Spark's own TorchDistributor (pyspark.ml.torch.distributor, DDP over gloo) on the same
Spark standalone cluster and the same model: start-to-first-step (from the call in the driver to the end of
rank 0's first optimizer step) and steps/s (rank 0, after the first step), interleaved rounds, medians and the
ratio. The table is markdown for docs/benchmarks/spark.md.

    sudo .venv/bin/python scripts/bench_spark.py [--rounds 5] [--steps 100] [--np 4] [--master spark://...]

Without --master it brings up the simulated hosts and scripts/spark_testbed.py's cluster (master in h1, a worker
of 2 cores in h2 and h3; root, like every testbed), runs the driver in the root namespace, and takes all of it
down at the end. TorchDistributor needs pyspark's ml and sql extras (numpy; pandas and pyarrow for its mapInArrow stage):
`pip install "pyspark[ml,sql]==4.3.0"` (setup.cfg's `bench` extra: `pip install -e '.[bench]'`); the script says so and measures trainrun alone when it is missing.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "launcher"))


def _model():
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(256, 1))


def _batches(seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randn(64, 256, generator=g)
        yield x, x.sum(1, keepdim=True)


def trainrun_train(t0: float, steps: int) -> dict:
    """The Horovod program (horovod.torch): rank 0's first-step time (since t0, wall clock) and steps/s."""
    import horovod.torch as hvd
    import torch

    torch.set_num_threads(1)
    hvd.init()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    data = _batches(hvd.rank())
    first = start = 0.0
    for i in range(steps + 1):
        x, y = next(data)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if i == 0:
            first = time.time() - t0
            start = time.perf_counter()
    return {"first_step_s": first, "steps_per_s": steps / (time.perf_counter() - start)}


def ddp_train(t0: float, steps: int) -> dict:
    """The same model and steps under torch DDP (gloo), as TorchDistributor runs it."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = _batches(dist.get_rank())
    first = start = 0.0
    for i in range(steps + 1):
        x, y = next(data)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if i == 0:
            first = time.time() - t0
            start = time.perf_counter()
    out = {"first_step_s": first, "steps_per_s": steps / (time.perf_counter() - start)}
    dist.destroy_process_group()
    return out


def torch_distributor():
    """TorchDistributor, or None with the line that says how to install it."""
    try:
        import pandas  # noqa: F401  (TorchDistributor runs its stage through mapInArrow: pandas and pyarrow)
        import pyarrow  # noqa: F401
        from pyspark.ml.torch.distributor import TorchDistributor
    except ImportError as err:
        print(f"bench_spark: TorchDistributor unavailable ({err}); install it with "
              "`pip install \"pyspark[ml,sql]==4.3.0\"` (or `pip install -e '.[bench]'`); measuring trainrun alone",
              file=sys.stderr)
        return None
    return TorchDistributor


def run_round(name: str, np: int, steps: int) -> dict:
    t0 = time.time()
    if name == "trainrun":
        import horovod.spark

        results = horovod.spark.run(trainrun_train, args=(t0, steps), num_proc=np)
        return results[0]
    dist = torch_distributor()
    assert dist is not None
    return dist(num_processes=np, local_mode=False, use_gpu=False).run(ddp_train, t0, steps)


def table(rows: dict[str, list[dict]], machine: str) -> str:
    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[name])

    lines = [f"{time.strftime('%Y-%m-%d')}, {machine}, {len(next(iter(rows.values())))} interleaved rounds, medians",
             "", "| contender | start to first step (s) | steps/s (rank 0) |", "|---|---|---|"]
    for name in rows:
        lines.append(f"| {name} | {med(name, 'first_step_s'):.2f} | {med(name, 'steps_per_s'):.1f} |")
    if len(rows) == 2:
        lines.append(f"| trainrun / TorchDistributor | {med('trainrun', 'first_step_s') / med('TorchDistributor', 'first_step_s'):.2f}x "
                     f"| {med('trainrun', 'steps_per_s') / med('TorchDistributor', 'steps_per_s'):.2f}x |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--master", help="an existing cluster's master URL (default: the simulated hosts' cluster)")
    ap.add_argument("--json", help="also write every round's numbers to this file")
    a = ap.parse_args()

    from trainrun.plan.horovod_shim import SHIM_DIR

    sys.path.insert(0, SHIM_DIR)   # `import horovod` in this driver is trainrun's shim, as in a Horovod program
    import spark_testbed

    why = spark_testbed.missing_requirement()
    if why:
        print(f"bench_spark: {why}", file=sys.stderr)
        return 1
    tb = lock = None
    master = a.master
    conf = {"spark.pyspark.python": spark_testbed.python()}
    if master is None:
        testbed = spark_testbed.testbed
        why = testbed.missing_requirement()
        if why:
            print(f"bench_spark: the simulated hosts: {why}", file=sys.stderr)
            return 1
        lock = testbed.lock(blocking=False)
        if lock is None:
            print(f"bench_spark: the testbed is in use (lock {testbed.LOCK_FILE}); try later", file=sys.stderr)
            return 1
        testbed.down()
        tb = testbed.up(3, owner=f"bench_spark:{os.getpid()}")
        master = spark_testbed.up(tb)
        conf = spark_testbed.driver_conf()
    os.environ.setdefault("PYSPARK_PYTHON", spark_testbed.python())
    try:
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.master(master).appName("bench_spark")
        for k, v in conf.items():
            builder = builder.config(k, v)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        names = ["trainrun"] + (["TorchDistributor"] if torch_distributor() else [])
        rows: dict[str, list[dict]] = {n: [] for n in names}
        for name in names:  # warm-up, each: the executors' Python workers and imports
            run_round(name, a.np, 5)
        for r in range(a.rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                got = run_round(name, a.np, a.steps)
                rows[name].append(got)
                print(f"round {r} {name}: {json.dumps(got)}", file=sys.stderr, flush=True)
        session.stop()
        machine = f"{platform.node()} ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end)"
        print(table(rows, machine))
        if a.json:
            Path(a.json).write_text(json.dumps(rows, indent=1))
    finally:
        if tb is not None:
            spark_testbed.down_spark()
            spark_testbed.testbed.down()
        if lock is not None:
            os.close(lock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
