"""Training throughput when the CPU is busy (issue 27): trainrun vs torch DDP vs no communication, 2 ranks.

    OMP_NUM_THREADS=1 mpiexec -n 2 python scripts/bench_contention.py [--rounds N] [--resnet-rounds N]
        [--models small,resnet] [--conditions idle,hogs,loader] [--out FILE]
    (the venv's mpiexec; `trainrun -np 2 python scripts/bench_contention.py` works too)

Models (Horovod's synthetic benchmark shape, built in torch here: the registry's torchvision does not
import beside the CPU torch):
  small  -- 100 x Linear(64, 64) with tanh (200 small gradients), batch 32, MSE;
  resnet -- ResNet-18 (BasicBlock [2, 2, 2, 2], 1000 classes), batch 16, 3x64x64 images, cross entropy.
Contenders, all in the same two rank processes (same-process A/B: load hits all alike), SGD lr 0.01:
  trainrun -- trainrun.torch.DistributedOptimizer, TRAINRUN_WAIT=auto (the waiting policy);
  trainrun-spin -- the same model and optimizer with the policy switched to spin (the behaviour before
                   the policy: lifecycle.wait_policy().set_mode, between blocks);
  ddp -- torch DistributedDataParallel on gloo (init_method env://, MASTER_ADDR/PORT from rank 0);
  none -- the model alone, no communication (the compute floor).
Conditions: idle -- the machine as it is; hogs -- one `while True: pass` process per core beside the
ranks (started by rank 0); loader -- every contender's batches come from a torch DataLoader with 2
workers per rank that "decode" synthetic images (per sample: random uint8 HxWx3, --decode-passes
smoothing passes in NumPy, normalise, CHW float32); the other conditions use fixed tensors.
Method: per round, every contender runs a block of --steps steps (order rotated per round) after an MPI
barrier; per block: wall time per step (rank 0), CPU seconds per step (user+sys of both rank processes,
all their threads, up to the block's last step, not the barrier after it; DataLoader workers not counted: the same for all). Reported per contender: steps/s
(from the median block), CPU s/step (median block), p90 step (ms, the slowest decile's threshold over
all steps), and the throughput ratio to ddp (median and 25th-75th percentile over rounds of the
per-round ratio). Prints markdown on rank 0 (and --out). Not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from mpi4py import MPI

import trainrun.torch as hvd
from trainrun.runtime import lifecycle

COMM = MPI.COMM_WORLD
CONTENDERS = ("trainrun", "trainrun-spin", "ddp", "none")


# ---- models ---------------------------------------------------------------------------------------
class Small(nn.Module):
    """100 x Linear(64, 64): 200 parameter tensors."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(100))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """torchvision's resnet18 layout: stem, 4 stages of 2 BasicBlocks (64-128-256-512), pool, fc."""

    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
            cin = cout
        self.stages = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


MODELS = {  # name: (constructor, batch, input shape)
    "small": (Small, 32, (64,)),
    "resnet": (ResNet18, 16, (3, 64, 64)),
}


# ---- the data loader condition ------------------------------------------------------------------
class SyntheticImages(torch.utils.data.Dataset):
    """Images made and "decoded" on the CPU per sample, as a real pipeline's workers would."""

    def __init__(self, size: int, passes: int, n: int = 1 << 20):
        self.size, self.passes, self.n = size, passes, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        img = rng.integers(0, 256, (self.size, self.size, 3), np.uint8).astype(np.float32) / 255
        for _ in range(self.passes):
            img = 0.5 * img + 0.125 * (np.roll(img, 1, 0) + np.roll(img, -1, 0) + np.roll(img, 1, 1) + np.roll(img, -1, 1))
        img = (img - img.mean()) / (img.std() + 1e-6)
        return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))


def loader_batches(batch: int, passes: int):
    dl = torch.utils.data.DataLoader(SyntheticImages(64, passes), batch_size=batch, num_workers=2,
                                     persistent_workers=True, prefetch_factor=2, shuffle=False)
    return dl, iter(dl)


# ---- contenders ---------------------------------------------------------------------------------
def make_steps(model_name: str, inputs):
    """{contender: step()}; `inputs()` gives the next (x, y) batch."""
    ctor, batch, shape = MODELS[model_name]
    small = model_name == "small"
    loss_fn = nn.functional.mse_loss if small else nn.functional.cross_entropy

    def stepper(model, opt):
        def step():
            x, y = inputs()
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        return step

    torch.manual_seed(0)
    ours = ctor()
    hvd.broadcast_parameters(ours.state_dict(), root_rank=0)
    ours_opt = hvd.DistributedOptimizer(torch.optim.SGD(ours.parameters(), lr=0.01), named_parameters=ours.named_parameters())
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(ctor())
    torch.manual_seed(0)
    local = ctor()
    ours_step = stepper(ours, ours_opt)
    return {"trainrun": ours_step, "trainrun-spin": ours_step,
            "ddp": stepper(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01)),
            "none": stepper(local, torch.optim.SGD(local.parameters(), lr=0.01))}


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def run_block(name: str, step, steps: int) -> tuple[list[float], float]:
    """(per-step wall seconds on this rank, CPU seconds of both ranks together) of `steps` steps."""
    lifecycle.wait_policy().set_mode("spin" if name == "trainrun-spin" else "auto")
    COMM.Barrier()
    c0 = cpu_s()
    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        walls.append(time.perf_counter() - t0)
    cpu = cpu_s() - c0  # (before the barrier: MPICH's barrier polls, and a rank that ran ahead would count it)
    COMM.Barrier()
    cpu = COMM.allreduce(cpu)
    lifecycle.wait_policy().set_mode("auto")
    return walls, cpu


def measure(model_name: str, condition: str, rounds: int, steps: int, passes: int) -> dict:
    ctor, batch, shape = MODELS[model_name]
    small = model_name == "small"
    g = torch.Generator().manual_seed(COMM.rank)
    x = torch.randn(batch, *shape, generator=g)
    y = torch.randn(batch, 64, generator=g) if small else torch.randint(0, 1000, (batch,), generator=g)
    dl = None
    if condition == "loader":
        dl, it = loader_batches(batch, passes)

        def inputs():
            imgs = next(it)
            return (imgs.reshape(batch, -1)[:, :64].contiguous(), y) if small else (imgs, y)
    else:
        def inputs():
            return x, y
    steps_by = make_steps(model_name, inputs)
    for name, step in steps_by.items():  # warm-up: caches, buckets, loader workers
        run_block(name, step, 2)
    walls = {c: [] for c in CONTENDERS}
    blocks = {c: [] for c in CONTENDERS}
    cpus = {c: [] for c in CONTENDERS}
    for r in range(rounds):
        order = CONTENDERS[r % len(CONTENDERS):] + CONTENDERS[:r % len(CONTENDERS)]
        for name in order:
            w, c = run_block(name, steps_by[name], steps)
            walls[name] += w
            blocks[name].append(sum(w) / steps)
            cpus[name].append(c / steps)
    if dl is not None:
        del it, dl
    return {"walls": walls, "blocks": blocks, "cpus": cpus}


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    xs = sorted(xs)
    q = len(xs) // 4
    return xs[q], statistics.median(xs), xs[-q - 1]


def rows(model_name: str, condition: str, res: dict, load: float) -> list[str]:
    out = []
    ddp = res["blocks"]["ddp"]
    for name in CONTENDERS:
        b = res["blocks"][name]
        ws = sorted(res["walls"][name])
        p90 = ws[min(len(ws) - 1, int(0.9 * len(ws)))]
        lo, med, hi = quartiles([d / t for d, t in zip(ddp, b)])
        ratio = "1.00" if name == "ddp" else f"{med:.2f}x ({lo:.2f}-{hi:.2f})"
        out.append(f"| {model_name} | {condition} ({load:.1f}) | {name} | {1 / statistics.median(b):.1f} | "
                   f"{statistics.median(res['cpus'][name]) * 1e3:.1f} | {p90 * 1e3:.1f} | {ratio} |")
    return out


def start_hogs(n: int) -> list:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="small,resnet")
    p.add_argument("--conditions", default="idle,hogs,loader")
    p.add_argument("--rounds", type=int, default=6, help="rounds for the small model (default 6)")
    p.add_argument("--steps", type=int, default=10, help="steps per block for the small model (default 10)")
    p.add_argument("--resnet-rounds", type=int, default=3)
    p.add_argument("--resnet-steps", type=int, default=2)
    p.add_argument("--decode-passes", type=int, default=4, help="smoothing passes per loaded image (default 4)")
    p.add_argument("--hogs", type=int, default=len(os.sched_getaffinity(0)), help="CPU-bound processes in `hogs` (default: one per core this process may use)")
    p.add_argument("--out", help="also write the markdown to this file (rank 0)")
    args = p.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    port = COMM.bcast(29500 + os.getpid() % 2000 if COMM.rank == 0 else None, root=0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(COMM.rank), WORLD_SIZE=str(COMM.size))
    dist.init_process_group("gloo", init_method="env://")
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = []
    t_start = time.monotonic()
    for condition in args.conditions.split(","):
        hogs = start_hogs(args.hogs) if condition == "hogs" and COMM.rank == 0 else []
        try:
            time.sleep(0.5 if hogs else 0)
            for model_name in args.models.split(","):
                load = os.getloadavg()[0]
                rounds, steps = (args.rounds, args.steps) if model_name == "small" else (args.resnet_rounds, args.resnet_steps)
                res = measure(model_name, condition, rounds, steps, args.decode_passes)
                lines += rows(model_name, condition, res, load)
        finally:
            for h in hogs:
                h.kill()
                h.wait()
    if COMM.rank == 0:
        head = [f"- date: {started}; {COMM.size} ranks; machine: {len(os.sched_getaffinity(0))} of {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}; "
                f"torch {torch.__version__}; load average (1 min) at the end {os.getloadavg()[0]:.1f}; "
                f"run took {time.monotonic() - t_start:.0f} s",
                f"- command: OMP_NUM_THREADS=1 mpiexec -n {COMM.size} python scripts/bench_contention.py " + " ".join(sys.argv[1:]),
                "", "| model | condition (load 1 min) | contender | steps/s | CPU ms/step (both ranks) | p90 step ms | throughput / ddp (IQR) |",
                "|---|---|---|---:|---:|---:|---:|"]
        text = "\n".join(head + lines) + "\n"
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
