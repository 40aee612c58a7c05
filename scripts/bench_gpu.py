"""GPU benchmark at world size 1 (one GPU): what trainrun's CUDA path costs over torch.distributed's NCCL.

Run on a machine with an NVIDIA GPU:

    trainrun -np 1 python scripts/bench_gpu.py [--out FILE] [--quick]

1. allreduce of a float32 CUDA tensor, 4 KiB to 256 MiB: torch.distributed (nccl) `all_reduce` vs
   trainrun `allreduce_` (in place) and `allreduce` (out of place) through NCCL, and trainrun through
   host memory (TRAINRUN_GPU_OPERATIONS=mpi). At world size 1 NCCL moves nothing between GPUs, so
   this is each path's overhead per call. Each call is followed by torch.cuda.synchronize().
2. a training step (forward, backward, optimizer step, synchronize) of a ResNet-50 (torchvision) and a
   deep MLP: no communication vs trainrun's DistributedOptimizer vs torch DDP (nccl). At world size 1
   Horovod's optimizer reduces nothing unless the job is elastic; the benchmark builds it as in an
   elastic job (TRAINRUN_ELASTIC=1), so every gradient goes through NCCL as DDP's buckets do.

Contenders run interleaved, one call each per iteration; the table gives medians and the spread
(25th-75th percentile). Not a test: it prints and writes a table.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trainrun.torch as hvd  # noqa: E402
from bench_common import cpu_model, fmt_size, fmt_us, interleaved_samples_us, write_out  # noqa: E402
from trainrun.runtime.backends import nccl  # noqa: E402
from trainrun.runtime.context import RUNTIME  # noqa: E402

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]


def quartiles(ts: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(ts, n=4)
    return q[0], statistics.median(ts), q[2]


def machine_lines() -> list[str]:
    smi = shutil.which("nvidia-smi")
    gpu = driver = "?"
    if smi:
        out = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.splitlines()
        if out:
            name, mem, driver = [p.strip() for p in out[0].split(",")]
            gpu = f"{name}, {mem}"
    nccl_torch = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "?"
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return [f"- date: {now}",
            f"- GPU: {gpu}; driver {driver}; CUDA (torch's build) {torch.version.cuda}",
            f"- host: nproc {len(os.sched_getaffinity(0))}, {cpu_model()}, {platform.system()} {platform.release()}",
            f"- software: Python {platform.python_version()}, torch {torch.__version__}, NCCL {nccl_torch} (torch's), "
            f"NCCL {nccl.version()} (the library trainrun loaded)"]


def allreduce_rows(quick: bool) -> list[str]:
    rows = ["| size | torch.distributed nccl | trainrun `allreduce_` nccl | ratio | trainrun `allreduce` (out of place) | "
            "ratio | trainrun through host memory (mpi) | ratio |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    sync = torch.cuda.synchronize
    for nbytes in SIZES:
        t = torch.randn(nbytes // 4, device="cuda")
        iters = 50 if quick else max(30, min(500, (4 << 30) // nbytes))

        def torch_nccl():
            dist.all_reduce(t)
            sync()

        def trainrun_in_place():
            hvd.allreduce_(t, name="bench.in_place", op=hvd.Sum)
            sync()

        def trainrun_out_of_place():
            hvd.allreduce(t, name="bench.out_of_place", op=hvd.Sum)
            sync()

        def trainrun_host():
            RUNTIME.current().use_gpu_operations("mpi")  # this session's CUDA path, for this call only
            try:
                hvd.allreduce_(t, name="bench.host", op=hvd.Sum)
            finally:
                RUNTIME.current().use_gpu_operations("nccl")
            sync()

        times = interleaved_samples_us([torch_nccl, trainrun_in_place, trainrun_out_of_place, trainrun_host], iters,
                                       sync, warmup=5)
        qs = [quartiles(ts) for ts in times]
        base = qs[0][1]
        cells = [f"{fmt_us(q[1])} ({fmt_us(q[0])}-{fmt_us(q[2])})" for q in qs]
        rows.append(f"| {fmt_size(nbytes)} | {cells[0]} | {cells[1]} | {qs[1][1] / base:.2f}x | {cells[2]} | "
                    f"{qs[2][1] / base:.2f}x | {cells[3]} | {qs[3][1] / base:.2f}x |")
        print(rows[-1], flush=True)
    return rows


class DeepMLP(nn.Sequential):
    def __init__(self, width=4096, depth=8):
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        super().__init__(*layers)


def models():
    """(name, factory, input batch) for the training rows."""
    out = []
    try:
        import torchvision
        out.append(("ResNet-50, batch 64 x 3x224x224", lambda: torchvision.models.resnet50(),
                    (torch.randn(64, 3, 224, 224, device="cuda"), torch.randint(0, 1000, (64,), device="cuda"))))
    except ImportError:
        print("torchvision missing: no ResNet-50 row", file=sys.stderr)
    out.append(("MLP 8 x Linear(4096, 4096), batch 256", DeepMLP,
                (torch.randn(256, 4096, device="cuda"), torch.randn(256, 4096, device="cuda"))))
    return out


def loss(model, x, y):
    out = model(x)
    return nn.functional.cross_entropy(out, y) if y.dtype == torch.int64 else nn.functional.mse_loss(out, y)


def train_rows(quick: bool) -> list[str]:
    rows = ["| model (param tensors, parameters) | no communication | trainrun DistributedOptimizer | over no comm. | "
            "torch DDP (nccl) | over no comm. | trainrun / DDP |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, factory, (x, y) in models():
        torch.manual_seed(0)
        plain = factory().cuda()
        tr = factory().cuda()
        tr.load_state_dict(plain.state_dict())
        ddp_model = factory().cuda()
        ddp_model.load_state_dict(plain.state_dict())
        ddp = nn.parallel.DistributedDataParallel(ddp_model, device_ids=[torch.cuda.current_device()])
        plain_opt = torch.optim.SGD(plain.parameters(), lr=1e-3, momentum=0.9)
        # at world size 1 Horovod's optimizer reduces only in elastic jobs (TRAINRUN_ELASTIC=1, set in main)
        tr_opt = hvd.DistributedOptimizer(torch.optim.SGD(tr.parameters(), lr=1e-3, momentum=0.9),
                                          named_parameters=tr.named_parameters())
        assert tr_opt._reduces, "DistributedOptimizer would not reduce: the row would measure nothing"
        ddp_opt = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)

        def step(model, opt):
            def run():
                opt.zero_grad()
                loss(model, x, y).backward()
                opt.step()
                torch.cuda.synchronize()
            return run

        iters = 10 if quick else 40
        times = interleaved_samples_us([step(plain, plain_opt), step(tr, tr_opt), step(ddp, ddp_opt)], iters,
                                       torch.cuda.synchronize, warmup=3)
        qs = [quartiles(ts) for ts in times]
        n_tensors = len(list(plain.parameters()))
        n_params = sum(p.numel() for p in plain.parameters())
        cells = [f"{fmt_us(q[1])} ({fmt_us(q[0])}-{fmt_us(q[2])})" for q in qs]
        rows.append(f"| {name} ({n_tensors}, {n_params / 1e6:.1f} M) | {cells[0]} | {cells[1]} | "
                    f"{qs[1][1] / qs[0][1]:.2f}x | {cells[2]} | {qs[2][1] / qs[0][1]:.2f}x | "
                    f"{qs[1][1] / qs[2][1]:.2f}x |")
        print(rows[-1], flush=True)
        del plain, tr, ddp, ddp_model, plain_opt, tr_opt, ddp_opt
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also write the report to this markdown file; none by default: "
                    "docs/benchmarks/gpu.md is a record of a run with notes, not to be overwritten")
    ap.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu.py: no CUDA GPU here (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    os.environ["TRAINRUN_ELASTIC"] = "1"  # read at init: the one-rank DistributedOptimizer reduces (train_rows)
    hvd.init()
    if hvd.size() != 1:
        print("bench_gpu.py: run it as one rank (trainrun -np 1): it measures overhead at world size 1", file=sys.stderr)
        return 2
    RUNTIME.current().use_gpu_operations("nccl")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    allreduce = allreduce_rows(args.quick)
    train = train_rows(args.quick)
    text = "\n".join(["# GPU: trainrun's CUDA path vs torch.distributed (NCCL), world size 1", "",
                      "`trainrun -np 1 python scripts/bench_gpu.py` (medians, 25th-75th percentile in brackets; "
                      "contenders interleaved; ratios over torch.distributed).", "", *machine_lines(), "",
                      "## allreduce of a float32 CUDA tensor (each call then torch.cuda.synchronize())", "",
                      *allreduce, "", "## training step (forward, backward, SGD step, synchronize)", "", *train, ""])
    write_out(text, args.out)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
