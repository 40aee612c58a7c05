#!/usr/bin/env python3
"""Time from the command to the first training step of a parameter-server cluster on 3 simulated SSH hosts
(1 chief, 2 workers, 2 ps: examples/tensorflow/ps_strategy.py --steps 1): `trainrun --tf-cluster ps=2` against
starting the same five tasks by hand, as users do without a launcher: a shell loop of `ssh HOST
'TF_CONFIG=... python ps_strategy.py' &` with a hand-written cluster (fixed ports), the ps and workers ended by
closing their SSH sessions (a pty: SIGHUP) once the chief is done. Rounds alternate; medians.

    sudo python scripts/bench_ps_start.py           # table to stdout and docs/benchmarks/ps_start.md
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

from bench_common import REPO, machine_lines, testbed_session, write_out

EXAMPLE = REPO / "examples" / "tensorflow" / "ps_strategy.py"
ROLES = [("h1", "chief", 0), ("h1", "worker", 0), ("h2", "worker", 1), ("h2", "ps", 0), ("h3", "ps", 1)]


def until_chief_done(proc, t0: float, what: str) -> float:
    for line in proc.stdout:
        if "chief: 1 steps" in line:
            return time.perf_counter() - t0
    raise SystemExit(f"bench_ps_start: {what}: the chief never finished its step")


def by_trainrun(tb) -> float:
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "trainrun", "--ssh-config", str(tb.ssh_config), "-H", "h1:2,h2:2,h3:1",
                          "--tf-cluster", "ps=2", sys.executable, str(EXAMPLE), "--steps", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    took = until_chief_done(p, t0, "trainrun")
    p.wait(120)
    return took


def by_hand(tb, ports) -> float:
    ip = {h.name: h.mgmt_ip for h in tb.hosts}
    cluster: dict[str, list[str]] = {}
    for (host, role, i), port in zip(ROLES, ports):
        cluster.setdefault(role, []).append(f"{ip[host]}:{port}")
    lines = []
    for host, role, i in ROLES:
        tf_config = json.dumps({"cluster": cluster, "task": {"type": role, "index": i}})
        remote = f"cd {shlex.quote(str(REPO))} && TF_CONFIG={shlex.quote(tf_config)} TF_CPP_MIN_LOG_LEVEL=2 " \
                 f"exec {sys.executable} {EXAMPLE} --steps 1"
        lines.append(f"ssh -F {tb.ssh_config} -tt {host} {shlex.quote(remote)} &")
    script = "\n".join(lines) + "\nwait\n"
    t0 = time.perf_counter()
    p = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         start_new_session=True)
    took = until_chief_done(p, t0, "by hand")
    os.killpg(p.pid, 15)  # the ssh clients: their ptys hang up the ps and workers on the hosts
    p.wait(60)
    time.sleep(2)
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "ps_start.md"))
    args = ap.parse_args()
    times = {"trainrun": [], "hand": []}
    with testbed_session(3) as tb:
        for r in range(args.rounds):
            for mode in (["trainrun", "hand"] if r % 2 == 0 else ["hand", "trainrun"]):
                t = by_trainrun(tb) if mode == "trainrun" else by_hand(tb, [23100 + 10 * r + k for k in range(5)])
                times[mode].append(t)
                print(f"  round {r + 1} {mode}: {t:.1f} s, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    lines = ["# Parameter-server cluster: command to first training step on 3 simulated SSH hosts", "",
             *machine_lines(), f"- method: `scripts/bench_ps_start.py`: {args.rounds} round(s), alternating; 1 chief, "
             "2 workers, 2 ps of examples/tensorflow/ps_strategy.py --steps 1 (TensorFlow imported by every task); "
             "time until the chief printed its step", "",
             "| start | seconds (median) | all rounds |", "|---|---:|---|"]
    for mode, label in (("trainrun", "`trainrun --tf-cluster ps=2 -H h1:2,h2:2,h3:1`"),
                        ("hand", "by hand: a shell loop of `ssh host 'TF_CONFIG=... python ...' &`")):
        lines.append(f"| {label} | {statistics.median(times[mode]):.1f} | {', '.join(f'{t:.1f}' for t in times[mode])} |")
    text = "\n".join(lines) + "\n"
    write_out(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
