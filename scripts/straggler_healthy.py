#!/usr/bin/env python3
"""No false alarm in healthy runs: the straggler rule's lowest margin over N healthy runs of the
acceptance job (issue 32) on the simulated-host testbed.

    .venv/bin/python scripts/straggler_healthy.py [--runs 20] [--seconds 40] [--slowed] [--json FILE]

Takes the testbed lock (scripts/testbed.py; waits up to --lock-wait s for other sessions' cluster tests),
brings up 4 hosts, and runs `trainrun -H h1:2,h2:2,h3:2,h4:2 --output-dir DIR` of
tests/process/workers/straggler_job.py (a small torch model under DistributedOptimizer, 8 ranks) --runs
times, healthy: no rank slowed. Per run: whether the launcher printed a straggler line (a false alarm),
and, replaying the run's DIR/straggler.jsonl through the launcher's own rule (supervisor/straggler.replay),
the lowest margin over every evaluation (`Slack`: for the candidate closest to being named, how far
its binding condition is from passing, in share points; > 0 means no verdict), with the condition and the
figures. --slowed adds one run with h3's ranks 0.1 s slower per step: seconds from training start to
the line that names it. Prints a markdown table (docs/benchmarks/straggler.md) and the load average
before and after each run (other sessions' load makes healthy runs noisier: a harder test). Brings the
testbed down at the end, whatever happened.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "launcher"
JOB = ROOT / "tests/process/workers/straggler_job.py"
sys.path.insert(0, str(SRC))

from trainrun.supervisor import straggler  # noqa: E402

_spec = importlib.util.spec_from_file_location("trainrun_testbed", ROOT / "scripts/testbed.py")
testbed = sys.modules["trainrun_testbed"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(testbed)

HOSTS = "h1:2,h2:2,h3:2,h4:2"


def run_once(tb, work: Path, seconds: float, slow_hosts: str = "") -> dict:
    """One launch of the job; its result, margins from its straggler.jsonl, and when each line came."""
    work.mkdir(parents=True, exist_ok=True)
    wrapper = work / "python-here"
    wrapper.write_text(f"#!/bin/sh\nexport PYTHONPATH={SRC} SLOW_HOSTS={slow_hosts} SLOW_S=0.1 "
                       f"SECONDS_TO_RUN={seconds}\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    out_dir = work / "out"
    argv = [sys.executable, "-m", "trainrun", "--ssh-config", str(tb.ssh_config), "--python", str(wrapper),
            "--output-dir", str(out_dir), "-H", HOSTS, str(wrapper), str(JOB)]
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=work,
                            env={**os.environ, "PYTHONPATH": str(SRC)}, start_new_session=True)
    err: list[tuple[float, str]] = []
    started: list[float] = []
    t = testbed.timed_lines(proc.stderr, err)
    try:
        for line in iter(proc.stdout.readline, b""):
            if line.rstrip().endswith(b"started"):
                started.append(time.monotonic())
        rc = proc.wait(timeout=seconds + 300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    t.join(10)
    lines = [(at, s) for at, s in err if s.startswith("trainrun: straggler:")]
    records = []
    path = out_dir / "straggler.jsonl"
    if path.exists():
        records = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    w = straggler.replay(records)
    low = w.lowest
    begin = max(started) if len(started) == 8 else None
    named = next(((at - begin if begin else None, s) for at, s in lines if "keeps up" not in s), None)
    return {"rc": rc, "seconds": round(time.monotonic() - t0, 1), "load_before": round(load0, 1),
            "load_after": round(os.getloadavg()[0], 1), "ranks_started": len(started),
            "lines": [s for _, s in lines], "windows": len(records),
            "replayed_verdicts": [list(v.ranks) for v in w.seen],
            "lowest": None if low is None else {"slack": round(low.slack, 4), "ranks": list(low.ranks),
                                                "binding": low.binding, "figures": low.figures},
            "named_after_s": None if named is None or named[0] is None else round(named[0], 1),
            "named_line": None if named is None else named[1],
            "stderr_tail": [s for _, s in err[-5:]] if rc != 0 else []}


def table(results: list[dict]) -> str:
    rows = ["| run | exit | windows | straggler lines | lowest slack | binding condition | candidate | "
            "its last share | over the others' | others' wait | its own wait | load avg (before-after) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(results, 1):
        low = r["lowest"]
        if low is None:
            cells = ["-"] * 7
        else:
            f = low["figures"]
            cells = [f"{low['slack']:.3f}", low["binding"], ",".join(map(str, low["ranks"])), f"{f['share']:.3f}",
                     f"{f['share'] - f['others_share']:.3f}", f"{f['others_wait']:.3f}", f"{f['own_wait']:.3f}"]
        rows.append(f"| {i} | {r['rc']} | {r['windows']} | {len(r['lines'])} | " + " | ".join(cells)
                    + f" | {r['load_before']}-{r['load_after']} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=40.0, help="training time of each run")
    ap.add_argument("--slowed", action="store_true", help="also one run with h3 slowed: time to the line")
    ap.add_argument("--lock-wait", type=float, default=1800.0, help="seconds to wait for the testbed lock")
    ap.add_argument("--json", metavar="FILE", help="write every run's result here")
    args = ap.parse_args()
    reason = testbed.missing_requirement()
    if reason:
        print(f"straggler_healthy: {reason}", file=sys.stderr)
        return 1
    deadline = time.monotonic() + args.lock_wait
    while (fd := testbed.lock(blocking=False)) is None:
        if time.monotonic() > deadline:
            print(f"straggler_healthy: testbed busy for {args.lock_wait:.0f} s", file=sys.stderr)
            return 1
        time.sleep(2)
    results: list[dict] = []
    slowed = None
    try:
        if testbed.namespaces():
            if (testbed.STATE_DIR / "state.json").exists() and testbed.Testbed().owner == "cli":
                print("straggler_healthy: a testbed is up from the command line; `scripts/testbed.py down` first",
                      file=sys.stderr)
                return 1
            testbed.down()  # left by a killed session: we hold the lock
        tb = testbed.up(4, owner=f"straggler_healthy:{os.getpid()}")
        with tempfile.TemporaryDirectory(prefix="straggler-healthy-") as tmp:
            for i in range(args.runs):
                r = run_once(tb, Path(tmp) / f"run{i + 1}", args.seconds)
                results.append(r)
                low = r["lowest"]
                print(f"run {i + 1}: exit {r['rc']}, {len(r['lines'])} straggler line(s), {r['windows']} windows, "
                      f"lowest slack {low['slack'] if low else '-'} ({low['binding'] if low else ''}), "
                      f"load {r['load_before']}-{r['load_after']}, {r['seconds']} s", flush=True)
                for s in r["lines"] + r["stderr_tail"]:
                    print("   ", s, flush=True)
            if args.slowed:
                slowed = run_once(tb, Path(tmp) / "slowed", args.seconds, slow_hosts="h3")
                print(f"slowed h3: exit {slowed['rc']}, named after {slowed['named_after_s']} s: "
                      f"{slowed['named_line']}", flush=True)
    finally:
        left = testbed.down()
        os.close(fd)
        if left:
            print(f"straggler_healthy: testbed teardown left {left}", file=sys.stderr)
    print()
    print(table(results))
    lows = [r["lowest"]["slack"] for r in results if r["lowest"]]
    alarms = sum(1 for r in results if r["lines"] or r["replayed_verdicts"])
    failed = sum(1 for r in results if r["rc"] != 0)
    print(f"\n{len(results)} healthy runs: {alarms} false alarm(s), {failed} failed run(s); lowest slack "
          f"{min(lows):.3f}" if lows else f"\n{len(results)} runs: no margin (no evaluation)")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": results, "slowed": slowed}, indent=1))
    return 0 if alarms == 0 and failed == 0 and len(lows) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
