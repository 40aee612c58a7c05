#!/usr/bin/env python3
"""Measure what the Slurm fan-out engine depends on, inside an allocation (numbers for docs/slurm-testbed.md).

    python3 scripts/slurm_testbed.py up 3
    python3 scripts/slurm_testbed.py exec 1 salloc -N3 python3 scripts/slurm_probe.py [--python PY] [-n REPS]

Prints medians (min..max) of: `srun -N3 true`, three one-host steps started together, `srun -N1 true`;
a 16 MiB binary round trip through one step's stdin/stdout with -u (must be byte-exact); the round-trip time
of 64-byte messages through such a step; and the mpi4py world of `srun --mpi=pmi2` (skipped without mpi4py).
Stdlib only; run it on an idle machine and compare within one run (timings are noisy on shared boxes).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import time

STEP = ["srun", "--overlap", "--kill-on-bad-exit"]
ECHO = ("import os, sys\n"
        "while True:\n"
        "    b = os.read(0, 65536)\n"
        "    if not b: break\n"
        "    os.write(1, b)\n")
WORLD = ("from mpi4py import MPI\nc = MPI.COMM_WORLD\nassert c.allreduce(1) == c.Get_size()\n"
         "print(c.Get_rank(), c.Get_size())\n")


def timed(argvs: list[list[str]], reps: int) -> str:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        procs = [subprocess.Popen(a, stdout=subprocess.DEVNULL) for a in argvs]
        if any(p.wait() for p in procs):
            return f"FAILED: {argvs[0]}"
        ts.append(time.perf_counter() - t0)
    return f"median {statistics.median(ts) * 1e3:.0f} ms ({min(ts) * 1e3:.0f}..{max(ts) * 1e3:.0f}, n={reps})"


def binary_roundtrip(host: str) -> str:
    data = os.urandom(16 << 20)
    t0 = time.perf_counter()
    p = subprocess.run(STEP + ["-N1", "-n1", f"-w{host}", "-u", sys.executable, "-c", ECHO], input=data,
                       capture_output=True)
    dt = time.perf_counter() - t0
    same = hashlib.sha256(p.stdout).digest() == hashlib.sha256(data).digest()
    return f"{'byte-exact' if same else f'CORRUPTED ({len(p.stdout)} of {len(data)} bytes)'} in {dt:.2f} s"


def rtt(host: str, n: int = 200) -> str:
    p = subprocess.Popen(STEP + ["-N1", "-n1", f"-w{host}", "-u", sys.executable, "-c", ECHO],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    msg, ts = b"x" * 64, []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            os.write(p.stdin.fileno(), msg)
            got = b""
            while len(got) < len(msg):
                got += os.read(p.stdout.fileno(), len(msg) - len(got))
            ts.append(time.perf_counter() - t0)
    finally:
        p.stdin.close()
        p.wait()
    ts = ts[10:]   # the first messages wait for the task to start
    return f"median {statistics.median(ts) * 1e3:.2f} ms (p90 {sorted(ts)[int(len(ts) * 0.9)] * 1e3:.2f}, n={len(ts)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable, help="interpreter with mpi4py for the pmi2 world")
    ap.add_argument("-n", type=int, default=10, help="repetitions of each timing")
    a = ap.parse_args()
    if "SLURM_JOB_ID" not in os.environ:
        print("slurm_probe: run it inside an allocation (salloc -N3 ...)", file=sys.stderr)
        return 2
    out = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                         capture_output=True, text=True, check=True).stdout.split()
    n = len(out)
    print(f"job {os.environ['SLURM_JOB_ID']}: {n} hosts {' '.join(out)}")
    print(f"srun -N{n} true (one step):         {timed([STEP + [f'-N{n}', '--ntasks-per-node=1', 'true']], a.n)}")
    print(f"{n} x srun -N1 -w hN true, together: "
          f"{timed([STEP + ['-N1', '-n1', f'-w{h}', 'true'] for h in out], a.n)}")
    print(f"srun -N1 true:                      {timed([STEP + ['-N1', '-n1', 'true']], a.n)}")
    print(f"16 MiB through srun -u stdin/stdout on {out[-1]}: {binary_roundtrip(out[-1])}")
    print(f"64-byte round trip through srun -u on {out[-1]}: {rtt(out[-1])}")
    has_mpi4py = subprocess.run([a.python, "-c", "import mpi4py"], capture_output=True).returncode == 0
    if has_mpi4py:
        print(f"srun --mpi=pmi2 -N{n} python (mpi4py world): "
              f"{timed([STEP + [f'-N{n}', '--ntasks-per-node=1', '--mpi=pmi2', a.python, '-c', WORLD]], max(3, a.n // 3))}")
        print(f"srun -N{n} python -c 'import mpi4py.MPI' (no world): "
              f"{timed([STEP + [f'-N{n}', '--ntasks-per-node=1', a.python, '-c', 'import mpi4py.MPI']], max(3, a.n // 3))}")
    else:
        print(f"srun --mpi=pmi2: skipped ({a.python} has no mpi4py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
