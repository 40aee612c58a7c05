#!/usr/bin/env python3
"""Bring-up time of an N-node Docker cluster (default 3), cold and warm, as a table.

  scripts/bench_cluster.py [--nodes 3] [--warm 3] [--no-cold] [--with-torch] [--json out.json]

Rows (each = `up N` until every sshd answered with host-key checking on, then `down`):
  cold: nothing cached    all trainrun images and staged wheels removed first: mmdebstrap base, pip download,
                          docker build, start (this REMOVES the build cache; it is rebuilt by the run)
  cold: base cached       node image + build stages removed, base image and wheels kept
  warm                    image cached (`up` still runs `docker build`, all layers cached)
  warm, --no-build        `up --no-build`: engine + sshd start only
Needs root and a Docker engine (scripts/ci_docker_setup.sh).
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster_ctl as cc  # noqa: E402


def one(n: int, build: bool, with_torch: bool) -> dict:
    name = "bench"
    t0 = time.monotonic()
    info = cc.up(n, name=name, build=build, with_torch=with_torch)
    up_s = time.monotonic() - t0
    t0 = time.monotonic()
    cc.down(name)
    return dict(info.timings, up_s=up_s, down_s=time.monotonic() - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--warm", type=int, default=3, help="warm repetitions (median reported)")
    p.add_argument("--no-cold", action="store_true", help="skip the two cold rows (keeps the build cache)")
    p.add_argument("--with-torch", action="store_true", help="bench the torch image (trainrun-node:torch)")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    try:
        cc.require_engine()
        rows = []
        if not a.no_cold:
            cc.clean()
            rows.append(("cold: nothing cached", [one(a.nodes, True, a.with_torch)]))
            cc.clean(keep_base=True, keep_wheels=True)
            rows.append(("cold: base + wheels cached", [one(a.nodes, True, a.with_torch)]))
        cc.build_image(a.with_torch)
        rows.append(("warm (docker build, all cached)", [one(a.nodes, True, a.with_torch) for _ in range(a.warm)]))
        rows.append(("warm, --no-build", [one(a.nodes, False, a.with_torch) for _ in range(a.warm)]))
    except cc.ClusterError as e:
        print(f"bench_cluster: error: {e}", file=sys.stderr)
        return 1
    cols = ["base_s", "wheels_s", "build_s", "compose_up_s", "sshd_ready_s", "collect_s", "ssh_check_s", "up_s", "down_s"]
    print(f"\n{a.nodes} nodes{' (torch image)' if a.with_torch else ''}; seconds, median of the runs in each row\n")
    print("| case | runs | " + " | ".join(c.removesuffix("_s") for c in cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    out = []
    for label, runs in rows:
        med = {c: statistics.median(r.get(c, 0.0) for r in runs) for c in cols}
        print(f"| {label} | {len(runs)} | " + " | ".join(f"{med[c]:.1f}" for c in cols) + " |")
        out.append({"case": label, "runs": runs, "median": med})
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
