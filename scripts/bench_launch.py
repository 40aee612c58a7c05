#!/usr/bin/env python3
"""Launch overhead: `trainrun -np 2 python -c pass` (and `horovodrun` the same: trainrun's horovodrun command) vs
MPICH's `mpiexec -n 2` vs `torchrun --nproc-per-node 2`.

Each round runs every launcher once, in an order rotated from round to round (so drift on a shared box
hits all of them alike); the table gives medians, minima and the ratio of medians to mpiexec's. The
target is trainrun <= 3x mpiexec; above that, the top import costs of `trainrun --version` are printed.

    python scripts/bench_launch.py                 # 20 rounds, table to stdout and docs/benchmarks/launch.md
    python scripts/bench_launch.py --rounds 5 --out /tmp/launch.md
    python scripts/bench_launch.py --compare-ref HEAD~1   # also trainrun as of another commit, side by side

The launchers are the ones next to this interpreter (the venv's); a missing one is skipped with a note.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import cpu_model  # noqa: E402
from bench_common import versions as _versions

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TARGET_RATIO = 3.0
HOROVODRUN = "horovodrun -np 2 python -c pass (trainrun's)"


def tool(name: str) -> str | None:
    path = BIN / name
    return str(path) if path.exists() else shutil.which(name)


def commands(tiny_script: str) -> dict[str, list[str]]:
    py = sys.executable
    out: dict[str, list[str]] = {"python -c pass (1 process, no launcher)": [py, "-c", "pass"]}
    mpiexec, trainrun, torchrun, horovodrun = tool("mpiexec"), tool("trainrun"), tool("torchrun"), tool("horovodrun")
    if mpiexec:
        out["mpiexec -n 2 python -c pass"] = [mpiexec, "-n", "2", py, "-c", "pass"]
    out["trainrun -np 2 python -c pass"] = ([trainrun] if trainrun else [py, "-m", "trainrun"]) + ["-np", "2", py, "-c", "pass"]
    # horovodrun's translation runs in the launcher's own process: this row is trainrun's plus argparse's
    out[HOROVODRUN] = ([horovodrun] if horovodrun else [py, "-m", "trainrun.horovodrun"]) + ["-np", "2", py, "-c", "pass"]
    if torchrun:
        # --standalone: a free port of its own, so runs on a shared box do not collide on 29500
        out["torchrun --standalone --nproc-per-node 2 tiny.py"] = [torchrun, "--standalone", "--nproc-per-node", "2", tiny_script]
    return out


def bench_env(pycache: str | None) -> dict[str, str]:
    """The environment the commands run in. With `pycache`, bytecode is cached there (outside the tree),
    as it is for any installed package, even where PYTHONDONTWRITEBYTECODE is set (an editable install
    would otherwise recompile trainrun's modules on every launch)."""
    env = dict(os.environ)
    if pycache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def time_once(argv: list[str], env: dict[str, str], extra: dict[str, str] | None = None) -> float:
    env = {**env, **(extra or {})}
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120, env=env)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"bench_launch: {' '.join(argv)} failed (rc {proc.returncode}):\n{proc.stderr.decode(errors='replace')}")
    return elapsed


def table(samples: dict[str, list[float]], rounds: int, bytecode: bool, load: tuple[float, float]) -> str:
    base_key = next((k for k in samples if k.startswith("mpiexec")), None)
    base = statistics.median(samples[base_key]) if base_key else None
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Launch overhead: 2 ranks of an empty Python program",
        "",
        f"- date: {now}",
        f"- machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {cpu_model()}, {platform.system()} {platform.release()}",
        f"- software: {_versions(('trainrun', 'mpich', 'torch'))}",
        f"- load average (1 min) at start / end: {load[0]:.1f} / {load[1]:.1f} (a shared box inflates every row)",
        f"- method: {rounds} rounds, each launcher once per round in rotated order; wall time of the whole command "
        "(`scripts/bench_launch.py`); "
        + ("bytecode cached (PYTHONPYCACHEPREFIX, as for an installed package)" if bytecode
           else "no bytecode cache: modules without a .pyc are compiled on every start"),
        "",
        "| command | median (s) | min (s) | max (s) | vs mpiexec (median) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, xs in samples.items():
        med = statistics.median(xs)
        ratio = f"{med / base:.2f}x" if base else "-"
        lines.append(f"| `{name}` | {med:.3f} | {min(xs):.3f} | {max(xs):.3f} | {ratio} |")
    return "\n".join(lines) + "\n"


def import_costs(env: dict[str, str], top: int = 15) -> str:
    """The largest cumulative import times of `python -X importtime -m trainrun --version`."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "trainrun", "--version"],
                          capture_output=True, text=True, timeout=60, env=env)
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum_us, name = (p.strip() for p in line.split(":", 1)[1].split("|"))
        rows.append((int(cum_us), int(self_us), name))
    rows.sort(reverse=True)
    out = [f"top {top} imports of `trainrun --version` by cumulative time:", "  cumulative_us  self_us  module"]
    out += [f"  {cum:13d}  {self_:7d}  {name}" for cum, self_, name in rows[:top]]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "launch.md"))
    ap.add_argument("--compare-ref", metavar="REF",
                    help="also time trainrun as of git REF (a temporary worktree on PYTHONPATH), in the same rounds")
    ap.add_argument("--no-bytecode-cache", action="store_true",
                    help="run with the environment as it is (PYTHONDONTWRITEBYTECODE honoured)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tiny = Path(tmp) / "tiny.py"
        tiny.write_text("pass\n")
        env = bench_env(None if args.no_bytecode_cache else os.path.join(tmp, "pycache"))
        cmds = commands(str(tiny))
        extra: dict[str, dict[str, str]] = {}
        if args.compare_ref:
            ref_tree = os.path.join(tmp, "ref")
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", ref_tree, args.compare_ref],
                           check=True, capture_output=True)
            name = f"trainrun@{args.compare_ref} -np 2 python -c pass"
            cmds[name] = [sys.executable, "-m", "trainrun", "-np", "2", sys.executable, "-c", "pass"]
            extra[name] = {"PYTHONPATH": os.path.join(ref_tree, "launcher")}
            # this tree's trainrun the same way, so the two differ only in the code
            cmds["trainrun -np 2 python -c pass"] = [sys.executable, "-m", "trainrun", "-np", "2", sys.executable, "-c", "pass"]
            extra["trainrun -np 2 python -c pass"] = {"PYTHONPATH": str(REPO / "launcher")}
            cmds[HOROVODRUN] = [sys.executable, "-m", "trainrun.horovodrun", "-np", "2", sys.executable, "-c", "pass"]
            extra[HOROVODRUN] = {"PYTHONPATH": str(REPO / "launcher")}
        for name in ("mpiexec", "torchrun"):
            if not any(k.startswith(name) for k in cmds):
                print(f"bench_launch: no {name} found; skipping it", file=sys.stderr)
        names = list(cmds)
        load_start = os.getloadavg()[0]
        for name in names:  # warm-up: page cache, bytecode
            time_once(cmds[name], env, extra.get(name))
        samples: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                samples[name].append(time_once(cmds[name], env, extra.get(name)))
        if args.compare_ref:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", ref_tree], capture_output=True)
        text = table(samples, args.rounds, not args.no_bytecode_cache, (load_start, os.getloadavg()[0]))
        print(text)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"written to {out}", file=sys.stderr)
        tr = statistics.median(samples["trainrun -np 2 python -c pass"])
        mp = next((statistics.median(v) for k, v in samples.items() if k.startswith("mpiexec")), None)
        if mp and tr / mp > TARGET_RATIO:
            print(f"trainrun is {tr / mp:.2f}x mpiexec, above the {TARGET_RATIO:.0f}x target", file=sys.stderr)
            print(import_costs(env), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
