#!/usr/bin/env python3
"""`trainrun --ray` against Ray Train's TorchTrainer (DDP over gloo) on the same Ray cluster and the same small
torch model: time from the command to rank 0's first optimizer step (wall clock, the command's start to the
step's end) and steps/s (rank 0, after the first step); interleaved rounds, medians and the ratio. The table
is markdown for docs/benchmarks/ray.md.

    sudo .venv/bin/python scripts/bench_ray.py [--rounds 5] [--steps 200] [--np 6]
    .venv/bin/python scripts/bench_ray.py --address HEAD:6379     # an existing cluster (run on one of its nodes)

Without --address it brings up the simulated hosts (scripts/testbed.py; root) and scripts/ray_testbed.py's
cluster on them (head in h1, 2 CPUs per node), runs both commands inside h1, and takes all of it down at the end.
Each contender is a fresh command per round (its interpreter, Ray driver, placement and workers' start-up
count): `python -m trainrun --ray -np N python scripts/bench_ray.py --worker ...` and `python
scripts/bench_ray.py --ray-train ...` (a driver calling TorchTrainer.fit). Ray Train needs `pip install
"ray[default,train]==2.60.0"` (setup.cfg's `bench` extra: `pip install -e '.[bench]'`); without it the script
says so and measures trainrun alone.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = "BENCH_RESULT "
CEILING = "no communication (trainrun --ray, no collective)"
INSTALL = "pip install \"ray[default,train]==2.60.0\" (or pip install -e '.[bench]')"


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


def _steps(model, opt, data, t0: float, steps: int) -> dict:
    import torch

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


def trainrun_worker(t0: float, steps: int, communicate: bool = True) -> None:
    """A rank under trainrun --ray: Horovod's torch API; rank 0 prints the result line. Without `communicate`,
    the same processes train without any collective (each its own model): the no-communication ceiling."""
    import torch

    import trainrun.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if communicate:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    out = _steps(model, opt, _batches(hvd.rank()), t0, steps)
    if hvd.rank() == 0:
        print(RESULT + json.dumps(out), flush=True)


def _ray_train_loop(config: dict) -> None:
    import torch
    import ray.train
    import ray.train.torch

    torch.set_num_threads(1)
    model = ray.train.torch.prepare_model(_model())  # DDP over the trainer's gloo group
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rank = ray.train.get_context().get_world_rank()
    out = _steps(model, opt, _batches(rank), config["t0"], config["steps"])
    if rank == 0:  # Ray forwards it to the driver's stdout (a report without a checkpoint leaves no metrics in
        print(RESULT + json.dumps(out), flush=True)  # Ray Train v2's Result)


def ray_train_driver(t0: float, steps: int, np: int) -> None:
    """TorchTrainer.fit with `np` CPU workers on gloo; prints rank 0's result line."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(logging_level="ERROR", log_to_driver=True)
    with tempfile.TemporaryDirectory(prefix="bench-ray-train-") as store:
        trainer = TorchTrainer(_ray_train_loop, train_loop_config={"t0": t0, "steps": steps},
                               scaling_config=ScalingConfig(num_workers=np, use_gpu=False),
                               torch_config=TorchConfig(backend="gloo"),
                               run_config=RunConfig(storage_path=store, name="bench"))
        trainer.fit()
    time.sleep(2.0)  # rank 0's result line, forwarded by Ray's log monitor (after the measured part)


def ray_train_missing() -> str | None:
    """Why Ray Train cannot run here (with how to install it), or None."""
    p = subprocess.run([sys.executable, "-c", "import ray.train.torch"], capture_output=True, text=True, timeout=120)
    if p.returncode == 0:
        return None
    last = (p.stderr.strip().splitlines() or ["import failed"])[-1]
    return f"Ray Train unavailable ({last}); install it with {INSTALL}"


def run_once(runner, name: str, np: int, steps: int) -> dict:
    """One fresh command of contender `name`; rank 0's numbers. `runner(argv)` runs argv where the driver runs."""
    t0 = time.time()
    here = str(Path(__file__).resolve())
    if name in ("trainrun --ray", CEILING):
        argv = [sys.executable, "-m", "trainrun", "--ray", "-np", str(np), sys.executable, here, "--worker", repr(t0),
                str(steps), *(["--no-communication"] if name == CEILING else [])]
    else:
        argv = [sys.executable, here, "--ray-train", repr(t0), str(steps), str(np)]
    p = runner(argv)
    lines = [line.split(RESULT, 1)[1] for line in p.stdout.splitlines() if RESULT in line]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{name}: exit {p.returncode}: {p.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])


def table(rows: dict[str, list[dict]], machine: str) -> str:
    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[name])

    lines = [f"{time.strftime('%Y-%m-%d')}, {machine}, {len(next(iter(rows.values())))} interleaved rounds, medians",
             "", "| contender | command to first step (s) | steps/s (rank 0) |", "|---|---|---|"]
    for name in rows:
        lines.append(f"| {name} | {med(name, 'first_step_s'):.2f} | {med(name, 'steps_per_s'):.1f} |")
    contenders = [n for n in rows if n != CEILING]
    if len(contenders) == 2:
        a, b = contenders
        lines.append(f"| {a} / {b} | {med(a, 'first_step_s') / med(b, 'first_step_s'):.2f}x "
                     f"| {med(a, 'steps_per_s') / med(b, 'steps_per_s'):.2f}x |")
    if CEILING in rows:
        for name in contenders:
            lines.append(f"| {name}: steps/s of the ceiling | | {med(name, 'steps_per_s') / med(CEILING, 'steps_per_s'):.2f}x |")
    return "\n".join(lines)


def measure(runner, rounds: int, steps: int, np: int, with_ray_train: bool, ceiling: bool = False) -> dict[str, list[dict]]:
    names = ["trainrun --ray"] + (["Ray Train TorchTrainer"] if with_ray_train else []) + ([CEILING] if ceiling else [])
    rows: dict[str, list[dict]] = {n: [] for n in names}
    for name in names:  # warm-up: the nodes' worker pools, page cache, imports
        run_once(runner, name, np, 5)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            got = run_once(runner, name, np, steps)
            rows[name].append(got)
            print(f"round {r} {name}: {json.dumps(got)}", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--np", type=int, default=6)
    ap.add_argument("--address", help="an existing Ray cluster (default: the simulated hosts' cluster)")
    ap.add_argument("--json", help="also write every round's numbers to this file")
    ap.add_argument("--ceiling", action="store_true",
                    help="also the same ranks training without communicating (the no-communication ceiling)")
    ap.add_argument("--no-communication", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", nargs=2, metavar=("T0", "STEPS"), help=argparse.SUPPRESS)
    ap.add_argument("--ray-train", nargs=3, metavar=("T0", "STEPS", "NP"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        trainrun_worker(float(a.worker[0]), int(a.worker[1]), communicate=not a.no_communication)
        return 0
    if a.ray_train:
        ray_train_driver(float(a.ray_train[0]), int(a.ray_train[1]), int(a.ray_train[2]))
        return 0

    missing = ray_train_missing()
    if missing:
        print(f"bench_ray: {missing}; measuring trainrun alone", file=sys.stderr)
    if a.address:
        env = {**os.environ, "RAY_ADDRESS": a.address}

        def runner(argv):
            return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)

        rows = measure(runner, a.rounds, a.steps, a.np, missing is None, a.ceiling)
    else:
        sys.path.insert(0, str(ROOT / "scripts"))
        import ray_testbed
        from bench_common import testbed_session

        why = ray_testbed.missing_requirement()
        if why:
            print(f"bench_ray: {why}", file=sys.stderr)
            return 1
        with testbed_session(3) as tb:
            rc = ray_testbed.up(tb)
            try:
                rows = measure(lambda argv: rc.run(1, argv, cwd=ROOT, timeout=900), a.rounds, a.steps, a.np,
                               missing is None, a.ceiling)
            finally:
                left = ray_testbed.down(tb)
                if left:
                    print(f"bench_ray: Ray left {left}", file=sys.stderr)
    machine = f"{platform.node()} ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end)"
    print(table(rows, machine))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
