#!/usr/bin/env python3
"""Training against its no-communication ceiling (issue 40): the trainrun step and the same model's step with
no communication at all, in the SAME two rank processes, interleaved block by block, under `trainrun -np 2`
and under `mpiexec -n 2` (the venv's MPICH).

    python scripts/bench_ceiling.py                       # torch: 100 x Linear(64, 64), idle and hogs, both launchers
    python scripts/bench_ceiling.py --tf                  # TensorFlow Keras fit: 100 x Dense(64) and the MNIST CNN
    python scripts/bench_ceiling.py --models small,resnet --conditions idle --launchers trainrun --rounds 8
    python scripts/bench_ceiling.py --out /tmp/ceiling.md # the markdown table also written there
    PYTHONPATH=/tmp/base/launcher python scripts/bench_ceiling.py --label before   # another checkout's code

The driver (this script without --worker) starts itself with --worker under each launcher, collects rank 0's
`RESULT {json}` line and prints one markdown table (ready to paste into docs/benchmarks/ceiling.md).

Contenders, each a block of --steps steps after an MPI barrier, the order rotated every round:
  torch (torch.set_num_threads(1), SGD lr 0.01, seeded models):
    trainrun       -- trainrun.torch.DistributedOptimizer (as a Horovod user writes it);
    trainrun-nomet -- the same model and optimizer with the engine's straggler meter off for the block
                      (Meter.on = False: the launcher's per-step timing; the rest of the launcher's per-step
                      work, the diag thread's perf line every window, only exists under trainrun, hence the
                      two launchers);
    ddp            -- torch DistributedDataParallel on gloo (--no-ddp leaves it out);
    none           -- the same model, a plain optimizer, both ranks computing at once: the ceiling.
  TensorFlow (--tf; Keras 3 through trainrun.tensorflow.keras; Adam 0.001; fixed in-memory batches):
    trainrun       -- model compiled with hvd.DistributedOptimizer, `fit(steps_per_epoch=steps)` per block;
    none           -- a second compiled copy of the model with the plain optimizer, the same fit call.
    Per-step time within a fit block: from the first batch's end to the last's (a Keras callback), so
    fit's per-call set-up is left out of both alike.
Models: small (100 x Linear(64, 64) + tanh, batch 32, MSE: 200 small gradients, 1.7 MB), resnet (ResNet-18 of
scripts/bench_contention.py, batch 16, 3x64x64); --tf: dense (100 x Dense(64) tanh, batch 32, MSE), cnn (the
tutorial MNIST CNN of scripts/bench_tf_fit_worker.py, batch 64, sparse categorical cross entropy).
Conditions: idle (the machine as it is), hogs (one `while True: pass` process per core, started by rank 0).
Per block, the time per step is the slower rank's (block wall time / steps, MAX over ranks). Reported: the
median over rounds of each contender's ms/step and of its CPU per step (user + system of both rank
processes, all their threads: the measure least moved by other load on a shared machine), `of ceiling` = the median over rounds of none_ms / this_ms
(1.00 is no cost at all), and `trainrun vs this` = the median of this_ms / trainrun_ms (> 1: trainrun is
faster), with the 25th-75th percentile of the per-round ratios. Not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


# ================================================================================================
# driver
# ================================================================================================
def launcher_argv(launcher: str) -> list[str]:
    if launcher == "trainrun":
        t = BIN / "trainrun"
        return ([str(t)] if t.exists() else [sys.executable, "-m", "trainrun"]) + ["-np", "2", "--prefix", "none"]
    if launcher == "mpiexec":
        return [str(BIN / "mpiexec"), "-n", "2"]
    raise SystemExit(f"bench_ceiling: unknown launcher {launcher!r}")


def run_worker(launcher: str, worker_args: list[str], timeout: float) -> dict:
    argv = launcher_argv(launcher) + [sys.executable, str(Path(__file__).resolve()), "--worker", *worker_args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if p.returncode or line is None:
        sys.exit(f"bench_ceiling: {' '.join(argv)} failed (rc {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return json.loads(line[7:])


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    xs = sorted(xs)
    q = len(xs) // 4
    return xs[q], statistics.median(xs), xs[-q - 1]


def fmt_ratio(xs: list[float]) -> str:
    lo, med, hi = quartiles(xs)
    return f"{med:.2f}x ({lo:.2f}-{hi:.2f})"


def table_rows(launcher: str, res: dict) -> list[str]:
    out = []
    for entry in res["results"]:
        model, cond, blocks, load = entry["model"], entry["condition"], entry["blocks"], entry["load"]
        none, ours = blocks["none"], blocks["trainrun"]
        for name, b in blocks.items():
            ceiling = fmt_ratio([n / t for n, t in zip(none, b)])
            vs = "-" if name == "trainrun" else fmt_ratio([t / o for t, o in zip(b, ours)])
            cpu = entry.get("cpus", {}).get(name)
            cpu_ms = f"{statistics.median(cpu) * 1e3:.1f}" if cpu else "-"
            out.append(f"| {launcher} | {model} | {cond} ({load[0]:.1f}-{load[1]:.1f}) | {name} | "
                       f"{statistics.median(b) * 1e3:.2f} | {ceiling} | {vs} | {cpu_ms} |")
    return out


def driver(args, rest: list[str]) -> int:
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load0 = " ".join(f"{x:.2f}" for x in os.getloadavg())
    t0 = time.monotonic()
    lines: list[str] = []
    notes: list[str] = []
    for launcher in args.launchers.split(","):
        print(f"bench_ceiling: {launcher} ...", file=sys.stderr, flush=True)
        res = run_worker(launcher, rest, args.timeout)
        rows = table_rows(launcher + (f" ({args.label})" if args.label else ""), res)
        print("\n".join(rows), file=sys.stderr, flush=True)
        lines += rows
        notes.append(f"{launcher}: its own process used {res.get('launcher_cpu_pct', 0):.2f}% of a core while the "
                     "ranks ran (CPU of rank 0's parent: trainrun, or hydra_pmi_proxy under mpiexec)")
    load1 = " ".join(f"{x:.2f}" for x in os.getloadavg())
    cmd = "python scripts/bench_ceiling.py " + " ".join(sys.argv[1:])
    head = [f"- date: {started}; machine: nproc {len(os.sched_getaffinity(0))}, {platform.processor() or platform.machine()}, "
            f"{platform.system()} {platform.release()}; load average (1/5/15 min) at start {load0}, at the end {load1}; "
            f"run took {time.monotonic() - t0:.0f} s",
            f"- command: `{cmd}` ({args.rounds} rounds of {args.steps}-step blocks per contender, order rotated per round)",
            "", "| launcher | model | condition (load 1 min, start-end) | contender | ms/step (median) | of ceiling: none/this (IQR) "
            "| this / trainrun (IQR) | CPU ms/step (both ranks) |", "|---|---|---|---|---:|---:|---:|---:|"]
    text = "\n".join(head + lines + [""] + [f"- {n}" for n in notes]) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        print(f"written to {args.out}", file=sys.stderr)
    return 0


# ================================================================================================
# worker (one rank)
# ================================================================================================
def start_hogs(n: int) -> list:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def interleave(comm, fns: dict, rounds: int, steps: int, block) -> tuple[dict, dict]:
    """({name: [seconds per step of each round's block (slower rank)]}, {name: [CPU seconds per step of
    both rank processes, all threads, each round's block]}), blocks in rotated order."""
    names = list(fns)
    for name in names:  # warm-up: caches, buckets, traced functions
        block(name, fns[name], 2)
    out: dict = {n: [] for n in names}
    cpu: dict = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            comm.Barrier()
            c0 = time.process_time()
            per_step = block(name, fns[name], steps)
            used = (time.process_time() - c0) / steps  # (before the barrier: MPICH's barrier polls)
            out[name].append(comm.allreduce(per_step, op=_MPI_MAX()))
            cpu[name].append(comm.allreduce(used))
    return out, cpu


def measured(comm, fns: dict, args, block, model_name: str, cond: str) -> dict:
    """One model in one condition: its contenders' interleaved blocks (`interleave`), with the load around them."""
    load0 = os.getloadavg()[0]
    blocks, cpus = interleave(comm, fns, args.rounds, args.steps, block)
    return {"model": model_name, "condition": cond, "blocks": blocks, "cpus": cpus, "load": [load0, os.getloadavg()[0]]}


def _MPI_MAX():
    from mpi4py import MPI
    return MPI.MAX


def torch_worker(args, comm) -> list:
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import trainrun.torch as hvd
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_contention import ResNet18, Small

    torch.set_num_threads(1)
    hvd.init()
    if args.ddp:
        port = comm.bcast(29500 + os.getpid() % 2000 if comm.rank == 0 else None, root=0)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(comm.rank),
                          WORLD_SIZE=str(comm.size))
        dist.init_process_group("gloo", init_method="env://")
    from trainrun.runtime import lifecycle
    meter = lifecycle.engine(None).meter  # (runtime/meter.py: the straggler timing the launcher reads)
    models = {"small": (Small, 32, (64,), nn.functional.mse_loss),
              "resnet": (ResNet18, 16, (3, 64, 64), nn.functional.cross_entropy)}
    results = []
    for cond in args.conditions.split(","):
        hogs = start_hogs(len(os.sched_getaffinity(0))) if cond == "hogs" and comm.rank == 0 else []
        try:
            time.sleep(0.5 if hogs else 0)
            for model_name in args.models.split(","):
                ctor, batch, shape, loss_fn = models[model_name]
                g = torch.Generator().manual_seed(comm.rank)
                x = torch.randn(batch, *shape, generator=g)
                y = torch.randn(batch, 64, generator=g) if model_name == "small" else torch.randint(0, 1000, (batch,), generator=g)

                def stepper(model, opt):
                    def step():
                        opt.zero_grad()
                        loss_fn(model(x), y).backward()
                        opt.step()
                    return step

                torch.manual_seed(0)
                ours = ctor()
                opt = hvd.DistributedOptimizer(torch.optim.SGD(ours.parameters(), lr=0.01),
                                               named_parameters=ours.named_parameters())
                torch.manual_seed(0)
                local = ctor()
                fns = {"trainrun": stepper(ours, opt), "trainrun-nomet": stepper(ours, opt)}
                if args.ddp:
                    torch.manual_seed(0)
                    ddp = nn.parallel.DistributedDataParallel(ctor())
                    fns["ddp"] = stepper(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01))
                fns["none"] = stepper(local, torch.optim.SGD(local.parameters(), lr=0.01))

                def block(name, step, n):
                    was = meter.on
                    meter.on = was and name != "trainrun-nomet"
                    t = time.perf_counter()
                    for _ in range(n):
                        step()
                    dt = (time.perf_counter() - t) / n
                    meter.on = was
                    return dt

                results.append(measured(comm, fns, args, block, model_name, cond))
        finally:
            for h in hogs:
                h.kill()
                h.wait()
    if args.ddp:
        dist.destroy_process_group()
    hvd.shutdown()
    return results


def tf_worker(args, comm) -> list:
    import numpy as np
    import trainrun.tensorflow.keras as hvd  # (sets KERAS_BACKEND=tensorflow)
    import tensorflow as tf
    import keras

    hvd.init()
    if args.tf_threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.tf_threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.tf_threads)

    def dense():
        return keras.Sequential([keras.Input((64,))] + [keras.layers.Dense(64, activation="tanh") for _ in range(100)])

    def cnn():
        return keras.Sequential([
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(8, [3, 3], activation="relu"),
            keras.layers.Conv2D(16, [3, 3], activation="relu"),
            keras.layers.MaxPooling2D(pool_size=(2, 2)),
            keras.layers.Dropout(0.25),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(10, activation="softmax")])

    models = {"dense": (dense, 32, "mse"), "cnn": (cnn, 64, "sparse_categorical_crossentropy")}
    if args.models == "small,resnet" or args.models == "small":  # the torch default: the TF pair instead
        args.models = "dense,cnn"

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter())

    results = []
    for cond in args.conditions.split(","):
        hogs = start_hogs(len(os.sched_getaffinity(0))) if cond == "hogs" and comm.rank == 0 else []
        try:
            time.sleep(0.5 if hogs else 0)
            for model_name in args.models.split(","):
                ctor, batch, loss = models[model_name]
                rng = np.random.default_rng(comm.rank)
                if model_name == "dense":
                    x = rng.standard_normal((batch * 8, 64), dtype=np.float32)
                    y = rng.standard_normal((batch * 8, 64), dtype=np.float32)
                else:
                    x = rng.random((batch * 8, 28, 28, 1), dtype=np.float32)
                    y = rng.integers(0, 10, batch * 8)
                data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)
                compiled = {}
                for name in ("trainrun", "none"):
                    keras.utils.set_random_seed(0)  # the same initial weights on every rank and for both
                    m = ctor()
                    opt = keras.optimizers.Adam(0.001)
                    m.compile(loss=loss, optimizer=hvd.DistributedOptimizer(opt) if name == "trainrun" else opt)
                    compiled[name] = m

                def block(name, model, n):
                    timer = Timer()
                    model.fit(data, steps_per_epoch=n + 1, epochs=1, verbose=0, callbacks=[timer])
                    t = timer.times
                    return (t[-1] - t[0]) / (len(t) - 1)

                results.append(measured(comm, compiled, args, block, model_name, cond))
        finally:
            for h in hogs:
                h.kill()
                h.wait()
    hvd.shutdown()
    return results


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` itself (not its children), 0.0 if unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def worker(args) -> int:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    parent = os.getppid()  # the launcher (trainrun) or MPICH's hydra_pmi_proxy: its own CPU while ranks train
    c0, t0 = proc_cpu_s(parent), time.monotonic()
    results = tf_worker(args, comm) if args.tf else torch_worker(args, comm)
    launcher_pct = 100 * (proc_cpu_s(parent) - c0) / (time.monotonic() - t0)
    if comm.rank == 0:
        print("RESULT " + json.dumps({"results": results, "launcher_cpu_pct": launcher_pct}), flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tf", action="store_true", help="TensorFlow Keras fit (models dense,cnn) instead of torch")
    p.add_argument("--models", default=None, help="torch: small,resnet (default small); --tf: dense,cnn (default both)")
    p.add_argument("--conditions", default="idle,hogs", help="idle,hogs (default both)")
    p.add_argument("--launchers", default="trainrun,mpiexec")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=None, help="steps per block (default: torch 20, --tf 10)")
    p.add_argument("--no-ddp", dest="ddp", action="store_false", help="torch: leave the DDP contender out")
    p.add_argument("--tf-threads", type=int, default=0, help="--tf: TF intra/inter-op threads (0: TF's default)")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", help="also write the markdown to this file")
    p.add_argument("--label", help="a word after the launcher's name in every row (e.g. the code measured: "
                   "run with PYTHONPATH=<another checkout>/launcher for a before/after pair)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.models is None:
        args.models = "dense,cnn" if args.tf else "small"
    if args.steps is None:
        args.steps = 10 if args.tf else 20
    if args.worker:
        return worker(args)
    rest = [a for a in sys.argv[1:] if a not in ("--worker",)]
    rest = strip_driver_opts(rest)
    rest += ["--models", args.models, "--steps", str(args.steps)]
    return driver(args, rest)


def strip_driver_opts(argv: list[str]) -> list[str]:
    """argv less the driver's own options (--launchers, --out, --timeout and their values)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--launchers", "--out", "--timeout", "--label"):
            skip = True
            continue
        if a.split("=", 1)[0] in ("--launchers", "--out", "--timeout", "--label"):
            continue
        out.append(a)
    return out


if __name__ == "__main__":
    sys.exit(main())
