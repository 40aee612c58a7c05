#!/usr/bin/env python3
"""External check: run mpi4py's own test suite (from its sdist) under `trainrun -np 2` and under the
mpich wheel's `mpiexec -n 2`, and write how many tests pass under each (a markdown table).

Usage: .venv/bin/python scripts/mpi4py_suite.py [--out docs/benchmarks/mpi4py_suite.md] [--np 2]
"""
from __future__ import annotations

import argparse
import datetime
import glob
import os
import platform
import re
import subprocess
import sys
import tarfile
import tempfile
import time

import mpi4py


def fetch_suite(workdir: str) -> str:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    f"mpi4py=={mpi4py.__version__}", "-d", workdir], check=True)
    sdist = glob.glob(os.path.join(workdir, "mpi4py-*.tar.gz"))[0]
    with tarfile.open(sdist) as tar:
        tar.extractall(workdir, filter="data")
    return glob.glob(os.path.join(workdir, "mpi4py-*", "test"))[0]


def summarize(output: str) -> dict:
    """Totals from each rank's unittest footer (`Ran N tests`, then `OK (...)` / `FAILED (...)`), counting
    only lines that start with them: trainrun's failure summary quotes the last stderr lines again."""
    ran = [int(n) for n in re.findall(r"^Ran (\d+) tests?", output, re.M)]
    footers = re.findall(r"^(?:OK|FAILED)(?: \((.*)\))?$", output, re.M)
    counts = {"failures": 0, "errors": 0, "skipped": 0}
    for footer in footers:
        for key, value in re.findall(r"(\w+)=(\d+)", footer or ""):
            if key in counts:
                counts[key] += int(value)
    total = sum(ran)
    return {"ranks_reporting": len(ran), "tests": total, **counts,
            "passed": total - counts["failures"] - counts["errors"] - counts["skipped"]}


def run(argv: list[str], cwd: str, spawn: bool) -> tuple[dict, float, int]:
    env = {**os.environ, "MPI4PY_TEST_SPAWN": "1" if spawn else "0"}
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=1200, env=env)
    return summarize(r.stdout + r.stderr), time.monotonic() - t0, r.returncode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs/benchmarks/mpi4py_suite.md")
    ap.add_argument("--np", type=int, default=2)
    args = ap.parse_args()
    bindir = os.path.dirname(sys.executable)
    with tempfile.TemporaryDirectory() as work:
        test = fetch_suite(work)
        root = os.path.dirname(test)
        rows = []
        mpiexec = [os.path.join(bindir, "mpiexec"), "-n", str(args.np), sys.executable, "test/main.py", "-q"]
        trainrun = [os.path.join(bindir, "trainrun"), "-np", str(args.np), "--prefix", "none", sys.executable, "test/main.py", "-q"]
        for name, argv, spawn in [
            ("mpiexec (mpich wheel)", mpiexec, True),
            ("mpiexec, spawn tests off", mpiexec, False),
            ("trainrun, spawn tests off", trainrun, False),
        ]:
            s, secs, rc = run(argv, root, spawn)
            rows.append((name, s, secs, rc))
    lines = [
        f"# mpi4py {mpi4py.__version__} test suite, {args.np} ranks",
        "",
        f"{datetime.date.today()}, {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}.",
        "Counts are summed over ranks (each rank runs the whole suite). trainrun's process manager does not",
        "offer MPI_Comm_spawn (PMI `mcmd=spawn`), so the comparison runs with MPI4PY_TEST_SPAWN=0 under both;",
        "it declines MPI name publishing, so test_dynproc's testNamePublishing errors under trainrun.",
        "",
        "| launcher | tests | passed | failures | errors | skipped | exit code | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s, secs, rc in rows:
        lines.append(f"| {name} | {s['tests']} | {s['passed']} | {s['failures']} | {s['errors']} | {s['skipped']} | {rc} | {secs:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
