#!/usr/bin/env python3
"""Time to a ready MPI world: trainrun (its own PMI-1 server) vs MPICH's `mpiexec` (Hydra), locally and on
4 simulated hosts.

    python scripts/bench_world.py                    # table to stdout and docs/benchmarks/world.md
    python scripts/bench_world.py --local-rounds 10 --host-rounds 3 --out /tmp/world.md
    python scripts/bench_world.py --no-hosts         # local rows only (no root / no testbed needed)

The program is `python -c 'from mpi4py import MPI; MPI.COMM_WORLD.Barrier()'` plus a check that the world
has the expected size (exit 1 otherwise: a PMI mistake that gives every rank a world of 1 is not "fast").
Local: 2 ranks, `trainrun -np 2` vs `mpiexec -n 2` (target: trainrun <= 1.5x mpiexec), with one process
that initialises MPI alone (singleton) as the floor. Hosts: the testbed's first 4 hosts (scripts/testbed.py,
lock held for the whole run, brought down at the end whatever happens), 1 and 2 ranks per host,
`trainrun --hostfile` (NIC choice cached by a warm-up run) vs `mpiexec -launcher ssh` (ssh -F <testbed
ssh_config> as -launcher-exec, -iface trt-root, -genv UCX_NET_DEVICES eth0,eth1: the NICs trainrun picks). Within each part every command runs once per round, in an
order rotated from round to round, after one untimed warm-up run each.
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

HOSTS = 4
TARGET_RATIO = 1.5
# mpiexec gets the NICs trainrun's probe picks on the testbed: UCX with every NIC allowed tries the hosts'
# docker0 decoy (one address everywhere) and MPI_Init fails, now that the hosts share no memory
NICS = "eth0,eth1"


def program(size: int) -> list[str]:
    code = ("import sys; from mpi4py import MPI; MPI.COMM_WORLD.Barrier(); "
            f"sys.exit(MPI.COMM_WORLD.Get_size() != {size})")
    return [sys.executable, "-c", code]


def local_commands() -> dict[str, list[str]]:
    mpiexec = tool("mpiexec")
    cmds = {"python, 1 process (singleton MPI_Init, no launcher)": program(1)}
    if mpiexec:
        cmds["mpiexec -n 2"] = [mpiexec, "-n", "2", *program(2)]
    cmds["trainrun -np 2"] = trainrun_argv() + ["-np", "2", *program(2)]
    return cmds


def host_commands(tb, tmp: Path) -> dict[str, list[str]]:
    names = [h.name for h in tb.hosts]
    files = hostfiles(tmp, names, (HOSTS,), (1, 2))
    mpiexec = tool("mpiexec")
    wrapper = ssh_wrapper(tmp, tb.ssh_config)
    cmds = {}
    for ppn in (1, 2):
        n = HOSTS * ppn
        if mpiexec:
            cmds[f"mpiexec -launcher ssh, {HOSTS} hosts x {ppn}"] = [
                mpiexec, "-launcher", "ssh", "-launcher-exec", wrapper, "-iface", testbed.ROOT_LINK,
                "-f", files[HOSTS, ppn][1], "-n", str(n), "-genv", "UCX_NET_DEVICES", NICS, *program(n)]
        cmds[f"trainrun, {HOSTS} hosts x {ppn}"] = trainrun_argv() + [
            "-np", str(n), "--hostfile", files[HOSTS, ppn][0], "--ssh-config", str(tb.ssh_config), *program(n)]
    return cmds


def rows(samples: dict[str, list[float]], cpu: dict[str, list[float]]) -> list[str]:
    base = next((med(v) for k, v in samples.items() if k.startswith("mpiexec")), None)
    base_cpu = next((med(v) for k, v in cpu.items() if k.startswith("mpiexec")), None)
    out = []
    for name, xs in samples.items():
        ratio = f"{med(xs) / base:.2f}x" if base else "-"
        cratio = f"{med(cpu[name]) / base_cpu:.2f}x" if base_cpu else "-"
        out.append(f"| `{name}` | {med(xs):.3f} | {min(xs):.3f} | {max(xs):.3f} | {ratio} | {med(cpu[name]):.3f} | {cratio} |")
    return out


def table(local: tuple[dict, dict], hosts: tuple[dict, dict] | None, args, header: list[str]) -> str:
    head = ["| command | median (s) | min (s) | max (s) | vs mpiexec (median) | CPU (s) | CPU vs mpiexec |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    lines = ["# Time to a ready MPI world (mpi4py `Barrier()` on `COMM_WORLD`)", "", *header,
             "- method: `scripts/bench_world.py`; wall time of the whole command, medians over interleaved rounds "
             "(order rotated each round, 1 untimed warm-up); program `python -c 'from mpi4py import MPI; "
             "MPI.COMM_WORLD.Barrier()'` + world-size check; bytecode cached",
             "- CPU: median user+sys seconds of the command and the local processes it waited for (launcher, ranks, "
             "ssh clients); on the simulated hosts, what sshd starts there (agents, proxies, ranks) is not counted", "",
             f"## This machine, 2 ranks ({args.local_rounds} rounds; target trainrun <= {TARGET_RATIO}x mpiexec)", "",
             *head, *rows(*local)]
    if hosts:
        for ppn in (1, 2):
            part = tuple({k: v for k, v in d.items() if k.endswith(f"x {ppn}")} for d in hosts)
            lines += ["", f"## {HOSTS} simulated hosts, {ppn} rank(s) per host ({args.host_rounds} rounds; "
                      "trainrun with the NIC choice cached)", "", *head, *rows(*part)]
        lines += ["", "Simulated hosts are network namespaces with their own sshd on this one machine: every host "
                  "shares its cores, but not its shared memory (each has its own IPC namespace and /dev/shm), so "
                  "MPICH (UCX) connects the hosts over TCP on their NICs, as it would connect machines."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--local-rounds", type=int, default=15)
    ap.add_argument("--host-rounds", type=int, default=6)
    ap.add_argument("--no-hosts", action="store_true", help="only the local rows (no testbed)")
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "world.md"))
    args = ap.parse_args()
    header = machine_lines()
    hosts = None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-world-") as tmp:
            env = bench_env(os.path.join(tmp, "pycache"))
            env["TRAINRUN_CACHE_DIR"] = os.path.join(tmp, "nic-cache")
            print("local:", file=sys.stderr)
            local = run_rounds(local_commands(), env, args.local_rounds)
            if not args.no_hosts:
                with testbed_session(HOSTS) as tb:
                    print(f"{HOSTS} hosts:", file=sys.stderr)
                    hosts = run_rounds(host_commands(tb, Path(tmp)), env, args.host_rounds)
    except BenchError as err:
        print(f"bench_world: error: {err}", file=sys.stderr)
        return 1
    write_out(table(local, hosts, args, header), args.out)
    tr = med(local[0]["trainrun -np 2"])
    mp = next((med(v) for k, v in local[0].items() if k.startswith("mpiexec")), None)
    if mp and tr / mp > TARGET_RATIO:
        print(f"bench_world: trainrun -np 2 is {tr / mp:.2f}x mpiexec -n 2, above the {TARGET_RATIO}x target",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
