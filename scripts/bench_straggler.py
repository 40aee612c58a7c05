"""What straggler measurement costs the training step, and how soon a slowed rank is named.

    python scripts/bench_straggler.py [--steps-per-block 40] [--blocks 24] [--detect-np 4]

1. Step cost: `trainrun -np 2` runs this file as a worker: a torch DistributedOptimizer over a model of
   100 parameter tensors (50 Linear(64, 64) layers: weights and biases), the step (forward, backward,
   synchronize, SGD step) timed with perf_counter. Blocks of steps alternate between the engine's
   measurement on and off (Engine.meter.on, the flag TRAINRUN_STRAGGLER=0 clears at init), in step on both
   ranks, so one run holds both and the machine's load hits both alike. Reported: median step time of
   each and their ratio (on/off), plus the median of per-block-pair ratios.
2. Time to the line: `trainrun -np N` of tests/process/workers/straggler_job.py, where rank N-1 sleeps
   0.1 s more per step from 20 s after training began (it prints 'slowing'); the seconds from that
   line to the launcher's 'trainrun: straggler:' line.
Prints a markdown table. Not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "process" / "workers" / "straggler_job.py"


def worker(steps_per_block: int, blocks: int) -> None:
    import torch

    import trainrun.torch as hvd
    from trainrun.runtime import lifecycle

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(50)])
    assert len(list(model.parameters())) == 100
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.001),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    engine = lifecycle.engine(None)
    x = torch.randn(16, 64)
    times = {True: [], False: []}
    pairs, prev = [], []
    for _ in range(5):  # warm-up: cache, fusion plan
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    for b in range(blocks):
        on = b % 2 == 0
        engine.meter.on = on
        block = []
        for _ in range(steps_per_block):
            t = time.perf_counter()
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            block.append(time.perf_counter() - t)
        times[on] += block
        if not on:
            pairs.append(statistics.median(prev) / statistics.median(block))
        prev = block
    engine.meter.on = True
    if hvd.rank() == 0:
        print("RESULT " + json.dumps({"on": statistics.median(times[True]), "off": statistics.median(times[False]),
                                      "pairs": pairs, "steps": len(times[True]) + len(times[False])}), flush=True)


def launch(np_: int, argv: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trainrun", "-np", str(np_), *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, **env}, text=True)


def step_cost(args) -> dict:
    p = launch(2, [sys.executable, __file__, "--worker", "--steps-per-block", str(args.steps_per_block),
                   "--blocks", str(args.blocks)], {})
    out, err = p.communicate(timeout=1200)
    for line in out.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise SystemExit(f"no result (rc {p.returncode}):\n{out}\n{err}")


def time_to_line(np_: int) -> tuple[float | None, str]:
    p = launch(np_, [str(JOB)], {"SLOW_RANKS": str(np_ - 1), "SLOW_S": "0.1", "SLOW_AFTER_S": "20",
                                  "SECONDS_TO_RUN": "60"})
    slowing, named = [], []

    def read_err():
        for line in p.stderr:
            if "trainrun: straggler:" in line and not named:
                named.append((time.monotonic(), line.strip()))
    t = threading.Thread(target=read_err, daemon=True)
    t.start()
    for line in p.stdout:
        if line.rstrip().endswith("slowing"):
            slowing.append(time.monotonic())
    p.wait(timeout=600)
    t.join(10)
    if not slowing or not named:
        return None, named[0][1] if named else "(no straggler line)"
    return named[0][0] - slowing[0], named[0][1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--steps-per-block", type=int, default=40)
    ap.add_argument("--blocks", type=int, default=24)
    ap.add_argument("--detect-np", type=int, default=4)
    ap.add_argument("--skip-detect", action="store_true")
    args = ap.parse_args()
    if args.worker:
        worker(args.steps_per_block, args.blocks)
        return
    r = step_cost(args)
    pairs = r["pairs"]
    print("| what | value |\n|---|---|")
    print(f"| step, measurement on (median of {r['steps'] // 2}) | {r['on'] * 1e3:.3f} ms |")
    print(f"| step, measurement off (median of {r['steps'] // 2}) | {r['off'] * 1e3:.3f} ms |")
    print(f"| ratio on/off (medians) | {r['on'] / r['off']:.3f} |")
    print(f"| ratio on/off per block pair: median (min-max) | {statistics.median(pairs):.3f} "
          f"({min(pairs):.3f}-{max(pairs):.3f}) |")
    if not args.skip_detect:
        seconds, line = time_to_line(args.detect_np)
        shown = "not named" if seconds is None else f"{seconds:.1f} s"
        print(f"| rank slowed (+0.1 s/step) -> straggler line, {args.detect_np} ranks | {shown} |")
        print(f"\n{line}")


if __name__ == "__main__":
    main()
