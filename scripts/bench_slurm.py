#!/usr/bin/env python3
"""Launch and ready-world time inside a 3-node Slurm allocation: trainrun through srun (its Slurm engine) vs
trainrun over SSH on the same hosts vs `srun --mpi=pmi2` (Slurm's own PMI-2 with the mpich wheel) vs plain
`srun` (the floor: no MPI world).

    sudo python3 scripts/bench_slurm.py                  # table to stdout and docs/benchmarks/slurm.md
    sudo python3 scripts/bench_slurm.py --rounds 5 --out /tmp/slurm.md

Brings up the simulated hosts (scripts/testbed.py) and a real Slurm on them (scripts/slurm_testbed.py), runs
itself inside `salloc -N3` on h1 (the login node) with --inside, and takes both down at the end. Within the
allocation every command runs once per round, in rotated order, after one untimed warm-up (bench_common).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from bench_common import REPO, BenchError, bench_env, machine_lines, med, run_rounds, testbed_session, write_out

HOSTS = 3


def program(size: int | None) -> list[str]:
    if size is None:
        return [sys.executable, "-c", "pass"]
    code = ("import sys; from mpi4py import MPI; MPI.COMM_WORLD.Barrier(); "
            f"sys.exit(MPI.COMM_WORLD.Get_size() != {size})")
    return [sys.executable, "-c", code]


def inside(rounds: int, ssh_config: str) -> dict:
    """Run in the allocation; returns {name: [seconds]}."""
    tr = [sys.executable, "-m", "trainrun"]
    ssh = ["--engine", "ssh", "-H", ",".join(f"h{i}" for i in range(1, HOSTS + 1)), "--ssh-config", ssh_config]
    cmds = {
        "launch: srun -N3 python -c pass": ["srun", "-N3", *program(None)],
        "launch: trainrun via srun, python -c pass": [*tr, "--mpi", "none", *program(None)],
        "launch: trainrun via SSH, python -c pass": [*tr, *ssh, "--mpi", "none", *program(None)],
        # the NICs trainrun picks: the hosts share no memory, and UCX with every NIC allowed fails on docker0
        "ready world: srun --mpi=pmi2 -N3": ["srun", "--mpi=pmi2", "-N3", "env", "UCX_NET_DEVICES=eth0,eth1",
                                             *program(HOSTS)],
        "ready world: trainrun via srun": [*tr, *program(HOSTS)],
        "ready world: trainrun via SSH": [*tr, *ssh, *program(HOSTS)],
    }
    with tempfile.TemporaryDirectory() as tmp:
        samples, _ = run_rounds(cmds, bench_env(os.path.join(tmp, "pycache")), rounds)
    return samples


def table(samples: dict, rounds: int) -> str:
    lines = ["# trainrun inside a Slurm allocation: launch and ready-world time", "", *machine_lines(),
             f"- setup: {HOSTS} simulated hosts (network namespaces on this one machine), real slurmctld/slurmd "
             "(Debian slurm-wlm 22.05), one rank per host, everything started from h1 inside `salloc -N3`",
             f"- method: {rounds} rounds, each command once per round in rotated order after a warm-up "
             "(`scripts/bench_slurm.py`); medians; ratios against the srun row of the same part", "",
             "| command | median (s) | min (s) | ratio |", "|---|---:|---:|---:|"]
    bases = {"launch": "launch: srun -N3 python -c pass", "ready world": "ready world: srun --mpi=pmi2 -N3"}
    for name, xs in samples.items():
        base = med(samples[bases[name.split(":")[0]]])
        lines.append(f"| `{name}` | {med(xs):.3f} | {min(xs):.3f} | {med(xs) / base:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "slurm.md"))
    ap.add_argument("--inside", metavar="SSH_CONFIG", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inside:
        print("RESULT " + json.dumps(inside(args.rounds, args.inside)), flush=True)
        return 0
    sys.path.insert(0, str(REPO / "scripts"))
    import slurm_testbed

    try:
        with testbed_session(HOSTS) as tb:
            sl = slurm_testbed.up(tb)
            try:
                p = sl.run(1, ["salloc", f"-N{HOSTS}", sys.executable, __file__, "--rounds", str(args.rounds),
                               "--inside", str(tb.ssh_config)], cwd=REPO, timeout=3600, capture_output=True, text=True)
            finally:
                slurm_testbed.down(tb.state_dir)
    except BenchError as err:
        print(f"bench_slurm: {err}", file=sys.stderr)
        return 1
    result = next((line[7:] for line in p.stdout.splitlines() if line.startswith("RESULT ")), None)
    if result is None:
        print(f"bench_slurm: the run inside the allocation failed (rc {p.returncode}):\n{p.stderr[-3000:]}", file=sys.stderr)
        return 1
    text = table(json.loads(result), args.rounds)
    print(text)
    write_out(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
