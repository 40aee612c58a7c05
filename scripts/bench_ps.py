#!/usr/bin/env python3
"""The MNIST CNN's Keras `fit` on 4 processes, side by side: TensorFlow's ParameterServerStrategy (trainrun
--tf-cluster chief=1,worker=2,ps=1: 2 workers compute, asynchronously), MultiWorkerMirroredStrategy (4 workers)
and trainrun's Horovod API (4 ranks), plus one process with no communication (the step's compute alone).
Rounds rotate the order; medians. Steps/s and examples/s per worker: a PS step is one worker's batch (64), an
allreduce step is every worker's batch at once (64 each).

    python scripts/bench_ps.py                    # table to stdout and docs/benchmarks/ps.md
    python scripts/bench_ps.py --rounds 1 --steps 10 --out /tmp/ps.md
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench_common import REPO, machine_lines, write_out

WORKER = str(Path(__file__).parent / "bench_ps_worker.py")
LAUNCH = {"ps": ["--tf-cluster", "chief=1,worker=2,ps=1"], "mwms": ["-np", "4"], "hvd": ["-np", "4"]}


def one(mode: str, steps: int, epochs: int) -> dict:
    argv = [sys.executable, WORKER, mode, str(steps), str(epochs)]
    if mode in LAUNCH:
        argv = [sys.executable, "-m", "trainrun", *LAUNCH[mode], "--prefix", "none", *argv]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    p = subprocess.run(argv, capture_output=True, text=True, timeout=1200, env=env)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if p.returncode or line is None:
        sys.exit(f"bench_ps: {mode} failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(line[7:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20, help="steps per epoch")
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs (after one warm-up epoch)")
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "ps.md"))
    args = ap.parse_args()
    modes = ["ps", "mwms", "hvd", "single"]
    times: dict[str, list[float]] = {m: [] for m in modes}
    workers = {}
    for r in range(args.rounds):
        for m in modes[r % 4:] + modes[:r % 4]:
            res = one(m, args.steps, args.epochs)
            times[m].append(res["step_s"])
            workers[m] = res["workers"]
            print(f"  round {r + 1} {m}: {res['step_s'] * 1000:.1f} ms/step, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    labels = {"ps": "ParameterServerStrategy (tf-keras): chief + 2 workers + 1 ps, `--tf-cluster`",
              "mwms": "MultiWorkerMirroredStrategy (tf-keras), 4 workers",
              "hvd": "trainrun.tensorflow.keras (Horovod API, Keras 3), 4 ranks",
              "single": "one process, no communication (Keras 3)"}
    lines = ["# Parameter servers vs allreduce: the MNIST CNN's Keras fit on 4 processes", "",
             *machine_lines(), f"- method: `scripts/bench_ps.py`: {args.rounds} round(s), the four in rotated order; per "
             f"run one warm-up epoch then {args.epochs} timed epochs of {args.steps} steps; median epoch / steps; "
             "64 samples per worker per step", "",
             "| run | ms/step | steps/s (job) | steps/s per worker | examples/s per worker | all rounds (ms/step) |",
             "|---|---:|---:|---:|---:|---|"]
    for m in modes:
        s = statistics.median(times[m])
        per_worker = 1 / s / workers[m] if m == "ps" else 1 / s  # a PS step is one worker's; an allreduce step all
        lines.append(f"| {labels[m]} | {s * 1000:.1f} | {1 / s:.1f} | {per_worker:.1f} | {per_worker * 64:.0f} | "
                     f"{', '.join(f'{t * 1000:.1f}' for t in times[m])} |")
    text = "\n".join(lines) + "\n"
    print(text)
    write_out(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
