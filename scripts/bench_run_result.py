#!/usr/bin/env python3
"""trainrun.run with big return values: wall time and peak memory of the caller and of the launcher.

Each measurement is a fresh caller process (`python -c`) running `trainrun.run(fn, np=N)` where every rank
returns a bytes object of SIZE MB (or a NumPy array with --numpy). A thread in the caller samples the RSS
of the caller and of each of its descendants every 20 ms; the launcher is the caller's child
(`python -m trainrun`), the ranks are the launcher's. Prints one line per size:

    python scripts/bench_run_result.py                  # 100 and 500 MB, 2 ranks
    python scripts/bench_run_result.py --sizes 50 --np 2 --hosts localhost:1,127.0.0.1:1
    python scripts/bench_run_result.py --sizes 50 --lines     # the way values of ranks on other hosts take
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CALLER = r'''
import json, os, sys, threading, time
import psutil
import trainrun

SIZE, NP, NUMPY, HOSTS, LINES = int(sys.argv[1]) << 20, int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] or None, sys.argv[5] == "1"

def big(size, as_numpy):
    if as_numpy:
        import numpy as np
        return np.full(size, int(os.environ["RANK"]), dtype=np.uint8)
    return bytes([int(os.environ["RANK"])]) * size

me = psutil.Process()
peak = {"caller": 0, "launcher": 0, "rank": 0}
done = threading.Event()

def sample():
    while not done.is_set():
        peak["caller"] = max(peak["caller"], me.memory_info().rss)
        for child in me.children():
            try:
                peak["launcher"] = max(peak["launcher"], child.memory_info().rss)
                for rank in child.children(recursive=True):
                    peak["rank"] = max(peak["rank"], rank.memory_info().rss)
            except psutil.Error:
                pass
        time.sleep(0.02)

threading.Thread(target=sample, daemon=True).start()
t0 = time.perf_counter()
# --lines: the ranks do not get the caller's socket, as on another host (the value comes back as output lines)
values = trainrun.run(big, (SIZE, NUMPY), np=NP, hosts=HOSTS, env={"TRAINRUN_RUN_SOCKET": ""} if LINES else None)
wall = time.perf_counter() - t0
done.set()
assert [len(v) for v in values] == [SIZE] * NP and all(v[-1] == r for r, v in enumerate(values))
print("RESULT " + json.dumps({"wall_s": wall, **{k: v / 2**20 for k, v in peak.items()}}))
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 500], help="MB returned by each rank")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--numpy", action="store_true", help="return a NumPy array instead of bytes")
    ap.add_argument("--hosts", default="", help="hosts= for trainrun.run (simulated remote ranks)")
    ap.add_argument("--lines", action="store_true", help="values as output lines, the way of ranks on other hosts "
                    "(TRAINRUN_RUN_REMOTE_RESULT_MB must allow the size)")
    args = ap.parse_args()
    for size in args.sizes:
        r = subprocess.run([sys.executable, "-c", CALLER, str(size), str(args.np), "1" if args.numpy else "0", args.hosts,
                            "1" if args.lines else "0"],
                           capture_output=True, text=True, timeout=900)
        line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
        if r.returncode != 0 or line is None:
            print(f"{size} MB: failed (rc {r.returncode}): {r.stderr.strip()[-2000:]}")
            continue
        m = json.loads(line[len("RESULT "):])
        kind = ("numpy" if args.numpy else "bytes") + (" as lines" if args.lines else "")
        print(f"{args.np} ranks x {size} MB {kind}: {m['wall_s']:.1f} s; peak RSS caller {m['caller']:.0f} MB, "
              f"launcher {m['launcher']:.0f} MB, largest rank {m['rank']:.0f} MB  ({time.strftime('%Y-%m-%d')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
