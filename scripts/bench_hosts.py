#!/usr/bin/env python3
"""Fan-out cost: `trainrun --check` and a trivial launch on 1, 4 and 8 simulated hosts, beside MPICH's
`mpiexec -launcher ssh` on the same hosts.

    python scripts/bench_hosts.py                    # 4 rounds, table to stdout and docs/benchmarks/hosts.md
    python scripts/bench_hosts.py --rounds 2 --out /tmp/hosts.md

Brings up the testbed (scripts/testbed.py) with 8 hosts once, holding its lock for the whole run, and brings
it down at the end whatever happens. Every round runs every (command, host count) once, in an order rotated
from round to round; after one untimed warm-up round. The program is `python -c pass` with the venv's
interpreter (same path on every simulated host). Rows:

    trainrun --check                    the full host check (facts on every host + NIC probe), 1 slot per host
    trainrun launch, NIC cache warm     `trainrun -np N --hostfile HF python -c pass`; the NIC choice comes from
                                        the cache (filled by the warm-up round); 1 and 2 ranks per host
    trainrun launch, --no-cache         the same with the NIC probe run again (what a cold cache costs);
                                        one host never probes, so that cell is left out
    mpiexec -launcher ssh               Hydra with `-launcher-exec` = ssh -F <testbed ssh_config>, `-iface
                                        trt-root` (so the proxies reach back to this machine), `-f host:N` file

The NIC cache lives in a temporary TRAINRUN_CACHE_DIR (the user's ~/.cache/trainrun is not touched).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from bench_common import (
    REPO,
    BenchError,
    bench_env,
    hostfiles,
    machine_lines,
    med,
    run_rounds,
    ssh_wrapper,
    testbed,
    testbed_session,
    tool,
    trainrun_argv,
    write_out,
)

COUNTS = (1, 4, 8)
ROWS = [  # (key, label)
    ("check", "`trainrun --check` (1 slot/host)"),
    ("tr1", "`trainrun` launch, 1 rank/host, NIC cache warm"),
    ("tr1nc", "`trainrun` launch, 1 rank/host, `--no-cache` (NIC probe)"),
    ("tr2", "`trainrun` launch, 2 ranks/host, NIC cache warm"),
    ("mp1", "`mpiexec -launcher ssh`, 1 rank/host"),
    ("mp2", "`mpiexec -launcher ssh`, 2 ranks/host"),
]
RATIOS = [("tr1", "mp1", "launch 1 rank/host, warm / mpiexec"), ("tr1nc", "mp1", "launch 1 rank/host, --no-cache / mpiexec"),
          ("tr2", "mp2", "launch 2 ranks/host, warm / mpiexec")]


def commands(tb, tmp: Path) -> dict[tuple[str, int], list[str]]:
    py = sys.executable
    names = [h.name for h in tb.hosts]
    files = hostfiles(tmp, names, COUNTS, (1, 2))
    ssh_cfg = str(tb.ssh_config)
    tr = trainrun_argv()
    mpiexec = tool("mpiexec")
    prog = [py, "-c", "pass"]
    cmds: dict[tuple[str, int], list[str]] = {}
    for n in COUNTS:
        cmds["check", n] = tr + ["--hostfile", files[n, 1][0], "--ssh-config", ssh_cfg, "--check"]
        for ppn in (1, 2):
            cmds[f"tr{ppn}", n] = tr + ["-np", str(n * ppn), "--hostfile", files[n, ppn][0], "--ssh-config", ssh_cfg, *prog]
        if n > 1:  # one host: no NIC choice, nothing to probe
            cmds["tr1nc", n] = tr + ["-np", str(n), "--hostfile", files[n, 1][0], "--ssh-config", ssh_cfg, "--no-cache", *prog]
        if mpiexec:
            wrapper = ssh_wrapper(tmp, tb.ssh_config)
            for ppn in (1, 2):
                cmds[f"mp{ppn}", n] = [mpiexec, "-launcher", "ssh", "-launcher-exec", wrapper, "-iface", testbed.ROOT_LINK,
                                       "-f", files[n, ppn][1], "-n", str(n * ppn), *prog]
    return cmds


def cell(xs: list[float] | None) -> str:
    return f"{med(xs):.2f} ({min(xs):.2f})" if xs else "-"


def table(samples: dict, cpu: dict, rounds: int, header: list[str]) -> str:
    lines = ["# Fan-out: `trainrun --check` and a trivial launch on 1, 4 and 8 simulated hosts", "", *header,
             f"- method: `scripts/bench_hosts.py`; testbed of 8 hosts (network namespaces + sshd on this one machine, "
             f"so all hosts share its {len(os.sched_getaffinity(0))} cores); {rounds} rounds after 1 warm-up round, every "
             "command once per round in rotated order; wall time of the whole command; program `python -c pass`; "
             "bytecode cached",
             "- cells: median (min) seconds; `8/1` = median on 8 hosts / median on 1 host (fan-out in parallel "
             "should keep it well under 2x)", "",
             "| command | 1 host | 4 hosts | 8 hosts | 8/1 |", "|---|---:|---:|---:|---:|"]
    for key, label in ROWS:
        xs = {n: samples.get((key, n)) for n in COUNTS}
        if not any(xs.values()):
            continue
        ratio = f"{med(xs[8]) / med(xs[1]):.2f}x" if xs[1] and xs[8] else "-"
        lines.append(f"| {label} | " + " | ".join(cell(xs[n]) for n in COUNTS) + f" | {ratio} |")
    if any(k == "mp1" for k, _ in samples):
        lines += ["", "trainrun / mpiexec (ratio of medians):", "", "| launch | 1 host | 4 hosts | 8 hosts |",
                  "|---|---:|---:|---:|"]
        for a, b, label in RATIOS:
            vals = [f"{med(samples[a, n]) / med(samples[b, n]):.2f}x" if (a, n) in samples and (b, n) in samples else "-"
                    for n in COUNTS]
            lines.append(f"| {label} | " + " | ".join(vals) + " |")
    lines += ["", "CPU seconds on this side (median user+sys of the command and the local processes it waited for: "
              "trainrun with paramiko, or mpiexec with its `ssh` clients; what sshd starts on the hosts is not "
              "counted):", "", "| command | 1 host | 4 hosts | 8 hosts |", "|---|---:|---:|---:|"]
    for key, label in ROWS:
        xs = {n: cpu.get((key, n)) for n in COUNTS}
        if any(xs.values()):
            lines.append(f"| {label} | " + " | ".join(f"{med(xs[n]):.2f}" if xs[n] else "-" for n in COUNTS) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "hosts.md"))
    args = ap.parse_args()
    header = machine_lines()  # load average before the testbed and the runs
    try:
        with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp, testbed_session(max(COUNTS)) as tb:
            env = bench_env(os.path.join(tmp, "pycache"))
            env["TRAINRUN_CACHE_DIR"] = os.path.join(tmp, "nic-cache")
            cmds = commands(tb, Path(tmp))
            if not any(k == "mp1" for k, _ in cmds):
                print("bench_hosts: no mpiexec found; skipping it", file=sys.stderr)
            samples, cpu = run_rounds(cmds, env, args.rounds)
    except BenchError as err:
        print(f"bench_hosts: error: {err}", file=sys.stderr)
        return 1
    write_out(table(samples, cpu, args.rounds, header), args.out)
    return 0

if __name__ == "__main__":
    sys.exit(main())
