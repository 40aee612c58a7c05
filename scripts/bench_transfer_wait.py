#!/usr/bin/env python3
"""How a rank waits for its gradient transfer, on more ranks than cores: ms a step of the Ray benchmark's model
(4 x Linear(256, 256) + ReLU, batch 64, SGD: 1 MB of gradients in one bucket) under `trainrun -np N`, one launch
per contender and round, contenders interleaved, rank 0's time per step (median over rounds).

    .venv/bin/python scripts/bench_transfer_wait.py [--np 4] [--rounds 3] [--steps 300] [--hogs 0]

Contenders (runtime/transfer_tuner.py says why the first two differ):
  trainrun        -- trainrun.torch.DistributedOptimizer as shipped: a transfer the rank waits for is waited by
                     the way the rank measured faster (the policy's sleeps, or MPI_Wait);
  trainrun-sleep  -- the same, every such wait by the waiting policy's sleeps between MPI_Tests (before);
  trainrun-mpi    -- the same, every such wait in MPICH's MPI_Wait;
  mpi             -- no engine: the gradients flattened, one MPI_Allreduce (mpi4py), copied back;
  none            -- no communication (the ceiling).
--hogs K starts K `while True: pass` processes beside the ranks for the whole run (other work on the host).
Also printed per contender: CPU ms a step of rank 0 (all its threads) and the milliseconds a step rank 0 spent
waiting for transfers. Prints markdown. Not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

CONTENDERS = ("trainrun", "trainrun-sleep", "trainrun-mpi", "mpi", "none")
RESULT = "BENCH_RESULT "


def worker(mode: str, steps: int) -> None:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    waited = [0.0]
    if mode.startswith("trainrun"):
        import trainrun.torch as hvd
        from trainrun.runtime import waiting

        shipped = waiting.TransferWait._caller_wait
        way = {"trainrun": shipped,
               "trainrun-sleep": lambda self, request, nbytes: self._policy.wait_request(request),
               "trainrun-mpi": lambda self, request, nbytes: waiting.wait_in_mpi(request)}[mode]

        def timed(self, request, nbytes):
            t = time.perf_counter()
            way(self, request, nbytes)
            waited[0] += time.perf_counter() - t

        waiting.TransferWait._caller_wait = timed
        hvd.init()
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        rank, barrier = hvd.rank(), lambda: hvd.allreduce(torch.zeros(1), name="barrier")
    else:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank, barrier = comm.Get_rank(), comm.Barrier
    params = list(model.parameters())
    g = torch.Generator().manual_seed(rank)

    def step():
        x = torch.randn(64, 256, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        if mode == "mpi":
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            comm.Allreduce(MPI.IN_PLACE, flat.numpy())
            flat /= comm.Get_size()
            off = 0
            for p in params:
                p.grad.copy_(flat[off:off + p.numel()].view_as(p))
                off += p.numel()
        opt.step()

    for _ in range(20):  # warm-up (and the tuner's first measurement)
        step()
    barrier()
    ru0, w0, t0 = resource.getrusage(resource.RUSAGE_SELF), waited[0], time.perf_counter()
    for _ in range(steps):
        step()
    dt = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    if rank == 0:
        cpu = ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime
        print(RESULT + json.dumps({"ms": dt / steps * 1e3, "cpu_ms": cpu / steps * 1e3,
                                   "wait_ms": (waited[0] - w0) / steps * 1e3}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--hogs", type=int, default=0)
    ap.add_argument("--worker", nargs=2, metavar=("MODE", "STEPS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker[0], int(a.worker[1]))
        return 0
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.hogs)]
    rows: dict[str, list[dict]] = {c: [] for c in CONTENDERS}
    try:
        for r in range(a.rounds):
            for c in (CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]):
                p = subprocess.run([sys.executable, "-m", "trainrun", "-np", str(a.np), sys.executable,
                                    os.path.abspath(__file__), "--worker", c, str(a.steps)],
                                   capture_output=True, text=True, timeout=600)
                got = [ln.split(RESULT, 1)[1] for ln in p.stdout.splitlines() if RESULT in ln]
                if p.returncode != 0 or not got:
                    print(f"bench_transfer_wait: {c} failed (exit {p.returncode}): {p.stderr.strip()[-800:]}",
                          file=sys.stderr)
                    return 1
                rows[c].append(json.loads(got[-1]))
                print(f"round {r} {c}: {got[-1]}", file=sys.stderr, flush=True)
    finally:
        for h in hogs:
            h.kill()
            h.wait()

    def med(c, k):
        return statistics.median(x[k] for x in rows[c])

    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()} ({os.cpu_count()} cores), "
          f"-np {a.np}, {a.hogs} hog(s), {a.rounds} interleaved rounds of {a.steps} steps, medians (range)\n")
    print("| contender | ms/step | of ceiling | CPU ms/step (rank 0) | transfer wait ms/step (rank 0) |")
    print("|---|---:|---:|---:|---:|")
    for c in CONTENDERS:
        ms = [x["ms"] for x in rows[c]]
        wait = f"{med(c, 'wait_ms'):.2f}" if c.startswith("trainrun") else "-"
        print(f"| {c} | {med(c, 'ms'):.2f} ({min(ms):.2f}-{max(ms):.2f}) | {med('none', 'ms') / med(c, 'ms'):.2f}x "
              f"| {med(c, 'cpu_ms'):.2f} | {wait} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
