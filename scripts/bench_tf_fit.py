#!/usr/bin/env python3
"""Keras `fit` steps/s of the issue's program 2 (the MNIST CNN, 64 per worker per step) on 2 ranks: trainrun's
Horovod API (`trainrun.tensorflow.keras`, Keras 3) vs TensorFlow's own MultiWorkerMirroredStrategy launched by
trainrun (TF_CONFIG from trainrun; tf-keras, since Keras 3's fit refuses that strategy), and one process with no
communication (the step's compute alone). Rounds alternate the three; medians of per-round step times.

    python scripts/bench_tf_fit.py                    # table to stdout and docs/benchmarks/tensorflow_fit.md
    python scripts/bench_tf_fit.py --rounds 3 --steps 60 --out /tmp/fit.md
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

WORKER = str(Path(__file__).parent / "bench_tf_fit_worker.py")


def one(mode: str, steps: int, warmup: int) -> dict:
    argv = [sys.executable, WORKER, mode, str(steps), str(warmup)]
    if mode != "single":
        argv = [sys.executable, "-m", "trainrun", "-np", "2", "--prefix", "none", *argv]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if p.returncode or line is None:
        sys.exit(f"bench_tf_fit: {mode} failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(line[7:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "tensorflow_fit.md"))
    args = ap.parse_args()
    modes = ["hvd", "mwms", "single"]
    times: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for m in modes[r % 3:] + modes[:r % 3]:
            times[m].append(one(m, args.steps, args.warmup)["step_s"])
            print(f"  round {r + 1} {m}: {times[m][-1] * 1000:.1f} ms/step, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    med = {m: statistics.median(v) for m, v in times.items()}
    labels = {"hvd": "trainrun.tensorflow.keras (Horovod API, Keras 3), 2 ranks",
              "mwms": "MultiWorkerMirroredStrategy (tf-keras) launched by trainrun, 2 workers",
              "single": "one process, no communication (Keras 3)"}
    lines = ["# Keras fit on 2 ranks: trainrun's Horovod API vs TensorFlow's MultiWorkerMirroredStrategy", "",
             *machine_lines(), f"- method: `scripts/bench_tf_fit.py`: {args.rounds} rounds, the three in rotated order; "
             f"per run, {args.warmup} warm-up steps then {args.steps} timed; 64 samples per worker per step; medians",
             "", "| run | ms/step (median) | steps/s | all rounds (ms) | vs trainrun |", "|---|---:|---:|---|---:|"]
    for m in modes:
        lines.append(f"| {labels[m]} | {med[m] * 1000:.1f} | {1 / med[m]:.1f} | "
                     f"{', '.join(f'{t * 1000:.1f}' for t in times[m])} | {med[m] / med['hvd']:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    write_out(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
