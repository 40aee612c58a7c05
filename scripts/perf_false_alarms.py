#!/usr/bin/env python3
"""False alarms of `trainrun --check --perf --perf-strict` on healthy simulated hosts while the machine is
loaded: RUNS runs on HOSTS hosts (one slot each) with HOGS CPU hogs (`python -c 'while True: pass'`, each in
a session of its own, in the root namespace) running beside them. A run that exits 4 or names a degrading
finding is a false alarm: nothing is wrong with these hosts. Prints a Markdown summary (and --out FILE).

  scripts/perf_false_alarms.py [--runs 20] [--hogs 2] [--hosts 4] [--mpi none|auto] [--save DIR] [--out FILE]

--save DIR keeps every run's JSON (run-K.json) to look into what a false alarm measured. Holds the testbed
(scripts/testbed.py) for the whole run, and ends the hogs whatever happens.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common  # noqa: E402
from bench_perf_check import check_perf  # noqa: E402

REPO = bench_common.REPO


def host_ratios(perf: dict) -> list[float]:
    """Per NIC, the lowest host's median over its links / the NIC's reference (the link rule's own ratio)."""
    out = []
    for link in perf["links"].values():
        ref, by_host = link.get("reference_mbps"), {}
        for s in link["samples"]:
            if s["mbps"]:
                for h in (s["src"], s["dst"]):
                    by_host.setdefault(h, []).append(s["mbps"])
        if ref and by_host:
            out.append(min(statistics.median(v) for v in by_host.values()) / ref)
    return out


def link_ratios(perf: dict) -> list[float]:
    out = []
    for link in perf["links"].values():
        vals = [s["mbps"] for s in link["samples"] if s["mbps"]]
        if vals and link.get("reference_mbps"):
            out.append(min(vals) / link["reference_mbps"])
    return out


def run(args) -> list[str]:
    hogs = []
    with tempfile.TemporaryDirectory() as d, bench_common.testbed_session(args.hosts) as tb:
        tmp = Path(d)
        wrapper = tmp / "python"
        wrapper.write_text(f'#!/bin/sh\nexport PYTHONPATH={REPO / "launcher"}\nexec {sys.executable} "$@"\n')
        wrapper.chmod(0o755)
        hf = tmp / "hostfile"
        hf.write_text("".join(f"h{i} slots=1\n" for i in range(1, args.hosts + 1)))
        save = Path(args.save) if args.save else None
        if save:
            save.mkdir(parents=True, exist_ok=True)
        try:
            for _ in range(args.hogs):
                hogs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True))
            alarms, walls, loads, hosts_r, links_r, compute_r = [], [], [], [], [], []
            for k in range(1, args.runs + 1):
                extra = ["--perf-strict"] + (["--mpi", "none"] if args.mpi == "none" else [])
                rc, perf, wall = check_perf(tb, hf, wrapper, *extra)
                if save:
                    (save / f"run-{k}.json").write_text(json.dumps({"rc": rc, "perf": perf}, indent=1))
                named = [f["message"] for f in perf["findings"] if f["degrades"]]
                if rc != 0 or named:
                    alarms.append((k, rc, named))
                g = [c["gflops"] for c in perf["compute"] if c["gflops"]]
                compute_r.append(min(g) / statistics.median(g))
                hosts_r += host_ratios(perf)
                links_r += link_ratios(perf)
                walls.append(wall)
                loads.append(os.getloadavg()[0])
                print(f"  run {k}/{args.runs}: rc {rc}, {wall:.1f} s, load {loads[-1]:.1f}, named {named}",
                      file=sys.stderr, flush=True)
        finally:
            for h in hogs:
                os.killpg(h.pid, signal.SIGKILL)
                h.wait()
    lines = [f"- runs: {args.runs} on {args.hosts} hosts with {args.hogs} CPU hog(s) beside them "
             f"(`--check --perf --perf-strict{' --mpi none' if args.mpi == 'none' else ''}`); load average during the runs "
             f"{min(loads):.1f}-{max(loads):.1f}; {statistics.median(walls):.1f} s per run (median)",
             f"- false alarms (exit 4 or a degrading finding): {len(alarms)} of {args.runs}"]
    lines += [f"  - run {k}: exit {rc}: {'; '.join(m)}" for k, rc, m in alarms]
    lines.append(f"- lowest host median / reference per NIC (the rule: 0.50): lowest {min(hosts_r):.2f}, median "
                 f"{statistics.median(hosts_r):.2f}")
    lines.append(f"- slowest single link / reference (after re-measuring; the rule for a lone link: 0.50): lowest "
                 f"{min(links_r):.2f}, median {statistics.median(links_r):.2f}")
    lines.append(f"- slowest host's compute / median (the rule: 0.70): lowest {min(compute_r):.2f}, median "
                 f"{statistics.median(compute_r):.2f}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--hogs", type=int, default=2)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--mpi", choices=("none", "auto"), default="none")
    ap.add_argument("--save", help="directory for every run's JSON")
    ap.add_argument("--out", help="also write the summary to this file")
    args = ap.parse_args()
    try:
        lines = bench_common.machine_lines() + run(args)
    except bench_common.BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
