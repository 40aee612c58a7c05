"""What waiting for an MPI request costs: MPICH's own blocking MPI_Wait vs polling with MPI_Test vs
the runtime's waiting policy (runtime/waiting.py), 2 ranks, idle and under load, in one run.

    mpiexec -n 2 python scripts/bench_wait.py [--iters N] [--hogs K]
    (the venv's mpiexec; or trainrun -np 2 python scripts/bench_wait.py)

For each size (4 KiB, 64 KiB, 1 MiB, 16 MiB float32, MPI_Iallreduce) and each way of waiting, two figures:
  - latency: median microseconds of one allreduce with both ranks in step (after a barrier);
  - late peer: rank 1 sleeps 2 ms before it joins; rank 0's CPU seconds (its process's user+sys,
    resource.getrusage) spent per wait, i.e. how much of those 2 ms of waiting burnt a core.
Ways of waiting: `test` (MPI_Test in a loop), `wait` (MPI_Wait), `policy-auto` / `policy-block`
(waiting.wait_request under that mode). The ways are interleaved per iteration so load hits all alike.
The whole table is taken twice: as the machine is, then with `--hogs` CPU-bound processes
(`while True: pass`, default one per core) started by rank 0 beside the ranks.
Prints a markdown table on rank 0. Not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np
from mpi4py import MPI

from trainrun.runtime import waiting

COMM = MPI.COMM_WORLD
SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
LATE_S = 0.002


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def poll(request) -> None:
    while not request.Test():
        pass


def mpi_wait(request) -> None:
    request.Wait()


def policy(mode: str):
    pol = waiting.Policy(mode)
    return lambda request: pol.wait_request(request)


WAYS = {"test": poll, "wait": mpi_wait, "policy-auto": policy("auto"), "policy-block": policy("block")}


def measure(iters: int) -> dict:
    """{(way, nbytes): (latency us median, late-peer CPU ms per wait median on rank 0)}"""
    out = {}
    for nbytes in SIZES:
        buf = np.ones(nbytes // 4, np.float32)
        lat = {w: [] for w in WAYS}
        cpu = {w: [] for w in WAYS}
        for i in range(iters + 2):
            for way, fn in WAYS.items():
                COMM.Barrier()
                t0 = time.perf_counter()
                fn(COMM.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM))
                dt = time.perf_counter() - t0
                COMM.Barrier()
                if COMM.rank == 1:
                    time.sleep(LATE_S)
                c0 = cpu_s()
                fn(COMM.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM))
                dc = cpu_s() - c0
                if i >= 2:
                    lat[way].append(dt * 1e6)
                    cpu[way].append(dc * 1e3)
        for way in WAYS:
            out[(way, nbytes)] = (statistics.median(lat[way]), statistics.median(cpu[way]))
    return out


def table(title: str, res: dict) -> str:
    lines = [f"#### {title}", "", "| size | " + " | ".join(f"{w} us / CPU ms" for w in WAYS) + " |",
             "|---|" + "---|" * len(WAYS)]
    for nbytes in SIZES:
        cells = [f"{res[(w, nbytes)][0]:.1f} / {res[(w, nbytes)][1]:.2f}" for w in WAYS]
        lines.append(f"| {nbytes >> 10} KiB | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--hogs", type=int, default=len(os.sched_getaffinity(0)))
    args = p.parse_args()
    load0 = os.getloadavg()
    first = measure(args.iters)
    hogs = []
    if COMM.rank == 0:
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        COMM.Barrier()
        time.sleep(0.5)
        load1 = os.getloadavg()
        loaded = measure(args.iters)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    if COMM.rank == 0:
        print(f"late peer: rank 1 joins {LATE_S * 1e3:.0f} ms late; CPU ms = rank 0's user+sys per wait (median "
              f"of {args.iters}); latency = median us with both ranks in step")
        print(table(f"as the machine is (load average {load0[0]:.1f})", first))
        print()
        print(table(f"with {args.hogs} CPU-bound processes beside the ranks (load average {load1[0]:.1f})", loaded))


if __name__ == "__main__":
    main()
