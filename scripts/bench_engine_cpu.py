"""The engine's per-op cost as CPU time and Python calls, one rank, two code versions interleaved.

    python scripts/bench_engine_cpu.py --base /tmp/base/launcher [--rounds 3]

A 1-rank job has no peer to wait for, so what an op costs is the engine's own work: process CPU time
per iteration (best of 5 blocks) and Python function calls per iteration (cProfile, exact). Both hold
up on a loaded machine far better than wall time, which is why this complements
`bench_allreduce.py --paths-only` (wall time, 2 ranks) when comparing a refactor against main.
Each round runs one child process per version, alternating which goes first; the table gives the
median over rounds. Paths: a lone named 4 KiB `allreduce_` (the lone-op path), 160 x 4 KiB
`allreduce_async_` + `synchronize` (queue, driver, completion), a 160-tensor `grouped_allreduce`.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PATHS = ("lone 4 KiB allreduce_", "160 x 4 KiB allreduce_async_ + synchronize", "grouped_allreduce of 160 x 4 KiB")


def child() -> None:
    import cProfile
    import pstats

    import numpy as np

    import trainrun.numpy as hvd

    hvd.init()
    xs = [np.full(1024, i, np.float32) for i in range(160)]
    x = np.ones(1024, np.float32)

    def lone():
        hvd.allreduce_(x, name="lone", op=hvd.Sum)

    def asyncs():
        for h in [hvd.allreduce_async_(a, name=f"a{i}", op=hvd.Sum) for i, a in enumerate(xs)]:
            hvd.synchronize(h)

    def grouped():
        hvd.grouped_allreduce(xs, op=hvd.Sum)

    out = {}
    for name, fn, reps in zip(PATHS, (lone, asyncs, grouped), (2000, 60, 100)):
        for _ in range(5):
            fn()
        blocks = []
        for _ in range(5):
            t = time.process_time()
            for _ in range(reps):
                fn()
            blocks.append((time.process_time() - t) / reps * 1e6)
        prof = cProfile.Profile()
        prof.enable()
        fn()
        prof.disable()
        out[name] = (min(blocks), sum(v[1] for v in pstats.Stats(prof).stats.values()))
    hvd.shutdown()
    print("RESULT " + json.dumps(out), flush=True)


def run_one(launcher_path: str) -> dict:
    env = {**os.environ, "PYTHONPATH": launcher_path, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"child with PYTHONPATH={launcher_path} failed:\n{proc.stderr[-2000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="the launcher/ folder of the code to compare against (required)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child()
        return
    if not args.base:
        parser.error("--base is required")
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "launcher")
    got: dict = {"base": [], "now": []}
    for i in range(args.rounds):
        order = (("base", args.base), ("now", here)) if i % 2 == 0 else (("now", here), ("base", args.base))
        for which, path in order:
            got[which].append(run_one(path))
    print(f"- {args.rounds} rounds, load average at end {os.getloadavg()[0]:.1f}; CPU us per iteration (median over "
          f"rounds of each process's best block), Python calls per iteration\n")
    print("| path | base: CPU | now: CPU | now / base | base: calls | now: calls |\n|---|---:|---:|---:|---:|---:|")
    for p in PATHS:
        b = statistics.median(r[p][0] for r in got["base"])
        n = statistics.median(r[p][0] for r in got["now"])
        print(f"| {p} | {b:.1f} us | {n:.1f} us | {n / b:.2f}x | {got['base'][0][p][1]} | {got['now'][0][p][1]} |")


if __name__ == "__main__":
    main()
