#!/usr/bin/env python3
"""Planning cost by job size: time and peak memory of making the plan of 1k, 10k and 100k ranks.

    python scripts/bench_plan.py                          # this checkout, 1k/10k/100k ranks
    python scripts/bench_plan.py --compare-ref HEAD~5     # also trainrun as of git REF, same sizes
    python scripts/bench_plan.py --out docs/benchmarks/plan.md

Each measurement is a fresh Python process (so its peak RSS, read with wait4, is that size's alone) that
imports trainrun from the source tree under test and plans a job of N ranks on N/8 hosts of 8 slots (hosts
without facts, as `--dry-run` plans a remote job), through the launch's own path (LaunchConfig -> shape_job ->
make_plan). Rows:
    plan          make_plan: placement, env contract, one ProcessSpec per rank
    plan + envs   the same, then every rank's env built once, one after another (what starting the ranks does)
    elastic       make_plan, then an elastic attempt's own variables added to every rank (elasticjob/loop.py's
                  with_env: plan/spec.py now; elasticjob/loop.py before)
    --dry-run     the whole command, `trainrun --hostfile H --dry-run train.py`, its table to /dev/null
A child that passes --timeout or the address-space limit (--mem-limit) is reported as such, not waited for.
Sizes above the launcher's cap (plan/limits.py, 65536) run with TRAINRUN_MAX_RANKS raised to the size.

Not a test: prints a table (and writes --out), asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import REPO, machine_lines, write_out  # noqa: E402

PER_HOST = 8

CHILD = r"""
import os, resource, sys, time
limit = int(os.environ["BENCH_MEM_LIMIT"])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
mode, hostfile, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
from trainrun.config import parse_config
from trainrun.plan.planner import make_plan, shape_job
t0 = time.perf_counter()
cfg = parse_config(("train.py",), hostfile=hostfile, num_proc=n)
try:
    from trainrun.launchspec import resolve  # the launch's config boundary: the specs, resolved once
    spec = resolve(cfg, {})
    opts, hosts = spec.plan, spec.hosts.hosts
except ImportError:  # before: LaunchConfig read by the planner itself
    opts, hosts = cfg, cfg.host_specs()
shape = shape_job(opts, hosts)
plan = make_plan(opts, shape, {}, "n00000", job_id="bench")
if mode == "elastic":
    try:
        from trainrun.plan.spec import with_env
    except ImportError:  # before: elasticjob/loop.py's own
        from trainrun.elasticjob.loop import with_env
    plan = with_env(plan, {"TRAINRUN_RESTART_COUNT": "1", "TRAINRUN_ELASTIC": "1"})
t1 = time.perf_counter()
if mode == "envs":
    total = 0
    for p in plan.procs:
        total += len(dict(p.env))
t2 = time.perf_counter()
print(f"{t1 - t0:.4f} {t2 - t1:.4f}")
"""


def hostfile(tmp: Path, n: int) -> str:
    path = tmp / f"hosts-{n}"
    hosts = (n + PER_HOST - 1) // PER_HOST
    path.write_text("".join(f"n{i:05d} slots={PER_HOST}\n" for i in range(hosts)))
    return str(path)


def measure(argv: list[str], env: dict, timeout: float) -> tuple[str, float, float, str]:
    """(status, wall s, peak RSS MiB, stdout) of one child; status "ok", "timeout" or "failed: ..."."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return "timeout", time.perf_counter() - t0, float("nan"), ""
    wall = time.perf_counter() - t0
    # communicate() reaped it: its own rusage is gone, so read the children's maximum (one child at a time,
    # and each size larger than the last: the maximum so far is this child's unless an earlier one was bigger)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if p.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["?"])[-1]
        return f"failed: {last[:80]}", wall, peak, ""
    return "ok", wall, peak, out.decode()


def run_isolated(argv: list[str], env: dict, timeout: float) -> tuple[str, float, float, str]:
    """measure() in a fresh intermediate process, so RUSAGE_CHILDREN's maximum is this child's alone."""
    import json

    code = (f"import json,sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
            f"from bench_plan import measure; print(json.dumps(measure({argv!r}, None, {timeout!r})))")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return f"failed: {(r.stderr.strip().splitlines() or ['?'])[-1][:80]}", float("nan"), float("nan"), ""
    status, wall, peak, out = json.loads(r.stdout)
    return status, wall, peak, out


def rows_for(label: str, src: Path, sizes: list[int], tmp: Path, args) -> list[str]:
    rows = []
    for n in sizes:
        env = dict(os.environ, PYTHONPATH=str(src), BENCH_MEM_LIMIT=str(args.mem_limit << 30),
                   TRAINRUN_MAX_RANKS=str(max(n, 65536)))
        hf = hostfile(tmp, n)
        for mode in args.modes.split(","):
            if mode == "dry-run":
                argv = [sys.executable, "-c", "import resource,os,sys; l=int(os.environ['BENCH_MEM_LIMIT']); "
                        "resource.setrlimit(resource.RLIMIT_AS,(l,l)); sys.argv[0]='trainrun'; "
                        "from trainrun.cli import main; main()", "--hostfile", hf, "--dry-run", "train.py"]
            else:
                argv = [sys.executable, "-c", CHILD, mode, hf, str(n)]
            status, wall, peak, out = run_isolated(argv, env, args.timeout)
            what = {"plan": "plan", "envs": "plan + envs", "elastic": "elastic attempt", "dry-run": "--dry-run"}[mode]
            if status != "ok":
                note = (f"gave up after {args.timeout:.0f} s" if status == "timeout" else
                        f"over the {args.mem_limit} GiB limit" if "MemoryError" in status else status)
                rows.append(f"| {label} | {n:,} | {what} | - | - | {note} |")
            elif mode == "dry-run":
                rows.append(f"| {label} | {n:,} | {what} | {wall:.2f} | {peak:,.0f} | whole command |")
            else:
                plan_s, env_s = map(float, out.split())
                secs = plan_s if mode == "plan" else plan_s + env_s
                rows.append(f"| {label} | {n:,} | {what} | {secs:.2f} | {peak:,.0f} | process wall {wall:.2f} s |")
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000", help="rank counts, comma-separated")
    ap.add_argument("--compare-ref", metavar="REF", help="also measure trainrun as of git REF (git archive)")
    ap.add_argument("--ref-sizes", help="sizes for REF (default: --sizes)")
    ap.add_argument("--modes", default="plan,envs,elastic,dry-run", help="rows to measure, comma-separated")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per measurement")
    ap.add_argument("--mem-limit", type=int, default=12, help="GiB of address space per measurement")
    ap.add_argument("--out", help="also write the report to this file")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    head = [
        "| trainrun | ranks | what | seconds | peak RSS (MiB) | note |",
        "|---|---:|---|---:|---:|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        tmp = Path(tmp)
        rows = rows_for("this checkout", REPO / "launcher", sizes, tmp, args)
        if args.compare_ref:
            ref_src = tmp / "ref"
            ref_src.mkdir()
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.compare_ref, "launcher"],
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(ref_src)], input=archive, check=True)
            ref_sizes = [int(s) for s in (args.ref_sizes or args.sizes).split(",")]
            rows += rows_for(f"at {args.compare_ref}", ref_src / "launcher", ref_sizes, tmp, args)
    text = "\n".join(["# Planning cost by job size", "", *machine_lines(),
                      f"- method: `scripts/bench_plan.py`; N ranks on N/{PER_HOST} hosts of {PER_HOST} slots, no facts "
                      "(as --dry-run plans a remote job); each row a fresh process; seconds inside the process "
                      "(imports excluded) except --dry-run (the whole command); peak RSS of that process",
                      "", *head, *rows, ""])
    write_out(text, args.out)


if __name__ == "__main__":
    main()
