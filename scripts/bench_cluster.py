#!/usr/bin/env python3
"""Bring-up time of an N-node Docker cluster (default 3), cold and warm, and the time from `up` to a passing
`trainrun --check` against it, as a Markdown table (stdout and --out, default docs/benchmarks/cluster.md).

  scripts/bench_cluster.py [--nodes 3] [--warm 3] [--no-cold] [--with-torch] [--json out.json] [--out FILE]

Rows (each run = `up N` until every sshd answered with host-key checking on, then `trainrun --check` from
this machine through the written hostfile + ssh_config until it exits 0, then `down`):
  cold: nothing cached    all trainrun images and staged wheels removed first: mmdebstrap base, pip download,
                          docker build, start (this REMOVES the build cache, torch image included; the
                          run rebuilds the image it benchmarks)
  cold: base cached       node image + build stages removed, base image and wheels kept
  warm                    image cached (`up` still runs `docker build`, all layers cached)
  warm, --no-build        `up --no-build`: engine + sshd start only
Columns: the stages of `up` (base, wheels, build, compose_up, sshd_ready = all banners seen, ssh_check),
up = the whole `up`, check = the `trainrun --check` runs, up_to_check = from the start of `up` to the exit 0
of `--check` (what a user waits for before the first job), down.
Needs root and a Docker engine (scripts/ci_docker_setup.sh); the launcher is this interpreter's trainrun.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common  # noqa: E402
import cluster_ctl as cc  # noqa: E402

NAME = "bench"
COLS = ["base_s", "wheels_s", "build_s", "compose_up_s", "sshd_ready_s", "ssh_check_s", "up_s", "check_s",
        "up_to_check_s", "down_s"]


def check_until_ok(info: cc.ClusterInfo, env: dict, deadline_s: float = 120.0) -> tuple[int, str]:
    """Run `trainrun --check` (strict host keys) until it exits 0: (attempts, last output). ClusterError
    if it never passes within deadline_s."""
    argv = bench_common.trainrun_argv() + [
        "--check", "--hostfile", info.hostfile, "--ssh-config", info.ssh_config, "--ssh-strict",
        "--python", "python3"]
    deadline = time.monotonic() + deadline_s
    attempts = 0
    while True:
        attempts += 1
        r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/tmp", timeout=deadline_s)
        if r.returncode == 0:
            if "routable between all hosts:" not in r.stdout:
                raise cc.ClusterError(f"--check passed without a NIC table:\n{r.stdout}")
            return attempts, r.stdout
        if time.monotonic() > deadline:
            raise cc.ClusterError(f"trainrun --check still failing after {attempts} attempts:\n"
                                  f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
        time.sleep(0.2)


def one(n: int, build: bool, with_torch: bool, env: dict) -> dict:
    t0 = time.monotonic()
    info = cc.up(n, name=NAME, build=build, with_torch=with_torch)
    up_s = time.monotonic() - t0
    try:
        t1 = time.monotonic()
        attempts, out = check_until_ok(info, env)
        done = time.monotonic()
        nics = next(ln for ln in out.splitlines() if "routable between all hosts:" in ln).split(":", 1)[1].strip()
    finally:
        t2 = time.monotonic()
        cc.down(NAME)
    return dict(info.timings, up_s=up_s, check_s=done - t1, up_to_check_s=done - t0, down_s=time.monotonic() - t2,
                check_attempts=attempts, nics=nics)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--warm", type=int, default=3, help="warm repetitions (median reported)")
    p.add_argument("--no-cold", action="store_true", help="skip the two cold rows (keeps the build cache)")
    p.add_argument("--with-torch", action="store_true", help="bench the torch image (trainrun-node:torch)")
    p.add_argument("--json", type=Path)
    p.add_argument("--out", default=str(cc.REPO / "docs" / "benchmarks" / "cluster.md"))
    a = p.parse_args()
    head = bench_common.machine_lines()
    cache = tempfile.mkdtemp(prefix="bench-cluster-")  # the launcher's NIC cache: not ~/.cache
    env = dict(os.environ, TRAINRUN_CACHE_DIR=cache)
    try:
        cc.require_engine()
        if cc._project_containers(cc.project_name(NAME)):
            raise cc.ClusterError(f"cluster {NAME!r} is up: `scripts/cluster down --name {NAME}` first")
        rows = []
        if not a.no_cold:
            cc.clean()
            rows.append(("cold: nothing cached", [one(a.nodes, True, a.with_torch, env)]))
            cc.clean(keep_base=True, keep_wheels=True)
            rows.append(("cold: base + wheels cached", [one(a.nodes, True, a.with_torch, env)]))
        cc.build_image(a.with_torch)
        rows.append(("warm (docker build, all cached)", [one(a.nodes, True, a.with_torch, env) for _ in range(a.warm)]))
        rows.append(("warm, --no-build", [one(a.nodes, False, a.with_torch, env) for _ in range(a.warm)]))
    except cc.ClusterError as e:
        print(f"bench_cluster: error: {e}", file=sys.stderr)
        return 1
    finally:
        subprocess.run(["rm", "-rf", cache], check=False)
    nics = sorted({r["nics"] for _, runs in rows for r in runs})
    attempts = max(r["check_attempts"] for _, runs in rows for r in runs)
    lines = [f"# Docker cluster: bring-up of {a.nodes} nodes{' (torch image)' if a.with_torch else ''} and time "
             "to a passing `trainrun --check`", "", *head,
             f"- load average at end (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
             f"- engine: Docker {cc.run(['docker', 'version', '-f', '{{.Server.Version}}']).stdout.strip()}, "
             f"compose `{' '.join(cc.find_compose())}`",
             "- method: `scripts/bench_cluster.py`; each run = `cluster_ctl.up` (returns once every sshd answered "
             "ssh with host-key checking on), then `trainrun --check --ssh-strict` from the host until exit 0, then "
             f"`down`; seconds, median of the runs of a row. `--check` passed at the first attempt in every run: "
             f"{'yes' if attempts == 1 else f'no (up to {attempts})'}; NICs it found routable: {', '.join(nics)}",
             "", "| case | runs | " + " | ".join(c.removesuffix("_s") for c in COLS) + " |",
             "|---|---:|" + "---:|" * len(COLS)]
    out = []
    for label, runs in rows:
        m = {c: statistics.median(r.get(c, 0.0) for r in runs) for c in COLS}
        lines.append(f"| {label} | {len(runs)} | " + " | ".join(f"{m[c]:.1f}" for c in COLS) + " |")
        out.append({"case": label, "runs": runs, "median": m})
    lines += ["", "base: mmdebstrap + `docker import`; wheels: pip download of the node's wheels; build: `docker "
              "build` (legacy builder) incl. the deps-stage tag; compose_up: `docker compose up -d`; sshd_ready: "
              "until every sshd sent its banner on the mgmt IP; ssh_check: `ssh hostname` on every node; "
              "up_to_check: start of `up` to `--check` exit 0.", ""]
    bench_common.write_out("\n".join(lines), a.out)
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
