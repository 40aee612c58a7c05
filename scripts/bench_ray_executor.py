#!/usr/bin/env python3
"""horovod.ray's RayExecutor (trainrun.rayexec) against a launch per call and against bare Ray actors.

What a persistent executor saves is the launch: start() once, then each call is a round trip through the
mailbox actor. Measured, in interleaved rounds on one Ray cluster (a local `ray.init(num_cpus=...)`, or
--address), with N workers:

    start       RayExecutor.start(): the launch (placement group, agents, ranks joining the cluster) until every
                worker has made its executable_cls object; and shutdown() after it
    call        executor.execute(lambda w: None): one call's round trip to every worker (median of --calls)
    launch      trainrun.run(noop, np=N, ray=ADDRESS): what a call costs without a persistent executor
    actors      N bare Ray actors, ray.get([a.noop.remote() ...]): Ray's own floor for a round trip
    steps       executor.run(train): --steps steps of a small torch model with hvd.DistributedOptimizer in
                the workers (hvd.init() in the first call); steps/s inside the call, and the call's wall time

Medians over --rounds rounds, and the ratios call/actors and launch/call. The machine line says the load
(run it on an idle machine for the record). Prints a Markdown report; --out also writes it to a file.

    python scripts/bench_ray_executor.py                       # 2 workers on a local Ray, 5 rounds
    python scripts/bench_ray_executor.py --workers 4 --rounds 9 --out docs/benchmarks/ray_executor_run.md
    python scripts/bench_ray_executor.py --address auto        # an existing cluster (RAY_ADDRESS)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launcher" / "trainrun" / "_horovod"))  # the horovod shim
from bench_common import machine_lines, write_out  # noqa: E402


def noop():
    return None


def train(steps: int):
    import time

    import torch

    import horovod.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return steps / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20, help="execute() round trips per round")
    ap.add_argument("--steps", type=int, default=50, help="training steps in the run() call")
    ap.add_argument("--address", default=None, help="a Ray cluster (default: start one here)")
    ap.add_argument("--out", default=None, help="also write the report here")
    args = ap.parse_args()

    import logging

    import ray

    import trainrun
    from horovod.ray import RayExecutor

    head = machine_lines()
    if args.address:
        ray.init(address=args.address, logging_level=logging.ERROR)
    else:
        ray.init(num_cpus=max(args.workers, os.cpu_count() or 1), include_dashboard=False, logging_level=logging.ERROR)
    address = ray.get_runtime_context().gcs_address

    @ray.remote(num_cpus=0)
    class Bare:
        def noop(self):
            return None

    got: dict[str, list[float]] = {k: [] for k in ("start", "shutdown", "call", "launch", "actors", "steps_s", "run")}
    for r in range(args.rounds + 1):  # round 0 warms up (imports, Ray's worker pool) and is not counted
        keep = r > 0
        # bare actors
        actors = [Bare.remote() for _ in range(args.workers)]
        ray.get([a.noop.remote() for a in actors])
        times = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            ray.get([a.noop.remote() for a in actors])
            times.append(time.perf_counter() - t0)
        for a in actors:
            ray.kill(a)
        # the executor
        ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=args.workers, cpus_per_worker=0.5)
        t0 = time.perf_counter()
        ex.start()
        start = time.perf_counter() - t0
        calls = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            ex.execute(lambda w: None)
            calls.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rates = ex.run(train, args=[args.steps])
        run_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ex.shutdown()
        stop = time.perf_counter() - t0
        # a launch per call
        t0 = time.perf_counter()
        trainrun.run(noop, np=args.workers, ray=address, cpus_per_proc=0.5)
        launch = time.perf_counter() - t0
        if keep:
            got["actors"].append(statistics.median(times))
            got["call"].append(statistics.median(calls))
            got["start"].append(start)
            got["shutdown"].append(stop)
            got["launch"].append(launch)
            got["steps_s"].append(min(rates))
            got["run"].append(run_s)
        print(f"round {r}{'' if keep else ' (warm-up)'}: start {start:.2f} s, call {statistics.median(calls) * 1e3:.1f} ms, "
              f"actors {statistics.median(times) * 1e3:.2f} ms, launch {launch:.2f} s, {min(rates):.0f} steps/s",
              file=sys.stderr)
    ray.shutdown()

    med = {k: statistics.median(v) for k, v in got.items()}
    lines = ["# horovod.ray's RayExecutor: start, call, launch per call", "", *head,
             f"- workers: {args.workers} (0.5 CPU each), {args.rounds} rounds (+1 warm-up), {args.calls} calls per "
             f"round, {args.steps} training steps per run()", "",
             "| what | median | min | max |", "|---|---|---|---|"]
    for key, label, scale, unit in (("start", "RayExecutor.start()", 1, "s"), ("shutdown", "RayExecutor.shutdown()", 1, "s"),
                                    ("call", "execute(lambda w: None)", 1e3, "ms"),
                                    ("actors", "bare Ray actors' round trip", 1e3, "ms"),
                                    ("launch", "trainrun.run(noop, ray=...) (a launch per call)", 1, "s"),
                                    ("run", "run(train): the call", 1, "s"),
                                    ("steps_s", "run(train): steps/s in the slowest worker", 1, "")):
        v = got[key]
        lines.append(f"| {label} | {med[key] * scale:.3g} {unit} | {min(v) * scale:.3g} {unit} | {max(v) * scale:.3g} {unit} |")
    lines += ["", f"- a call through the mailbox: {med['call'] / med['actors']:.1f}x a bare actor round trip",
              f"- a launch per call: {med['launch'] / med['call']:.0f}x a call to a started executor", ""]
    write_out("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
