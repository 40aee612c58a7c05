#!/usr/bin/env python3
"""Recovery time of an elastic trainrun job next to torchrun --max-restarts, and the cost of commit().

    python scripts/bench_elastic.py [--rounds 3] [--cluster] [--out docs/benchmarks/elastic.md]

Recovery: a 4-rank job trains (scripts/bench_elastic_worker.py, committing every 5 steps); at step 20
(for trainrun's `warm` rows: and once the job's spares are ready, --warm-ranks) the victim's ranks are SIGKILLed; the time is from the kill to the first training step printed by the
restarted job. Scenarios, interleaved round by round on this machine:
    trainrun --max-restarts      -np 4 on this machine, one rank killed, all 4 restarted from the agents' copy
    trainrun elastic (pipe)      2 "hosts" x 2 through the pipe engine, one host's ranks killed, 2 go on
    torchrun --max-restarts      --standalone --nproc-per-node 4, one rank killed, all 4 restarted from the disk checkpoint
    --cluster adds, on 3 simulated hosts x 2 (SSH): one host's ranks killed; and one host's network cut
    (default --heartbeat-timeout: the kernel's end of the SSH connection names it lost), 4 ranks go on;
    each warm and with --no-warm-ranks.
--anchor-only: of the one-machine scenarios only torchrun's (the anchor), and no commit table.
commit(): a 2-rank trainrun job commits a TorchState of 1, 16, 64, 256 MiB beside a memcpy of the same bytes
(scripts/bench_commit_worker.py); --commit-only runs just that and replaces its section of --out.
--phases: the restart path cut into steps (detect, stop, back-off + plan, process start, interpreter, import
torch, MPI world, sync, first step) for -np 4 --max-restarts and 2x2 pipe hosts; replaces its section of --out.
Medians of --rounds rounds; the machine line says what ran where. Prints a markdown table.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import REPO, BenchError, machine_lines, med, testbed_session, write_out  # noqa: E402

WORKER = str(REPO / "scripts" / "bench_elastic_worker.py")
PIPE = str(REPO / "tests" / "elastic" / "pipe_trainrun.py")
KILL_AT = 20
WARM_WAIT = 120.0  # seconds after KILL_AT for the spares to be ready
STEP = re.compile(r"step (\d+) size (\d+) restart (\d+) t=([\d.]+)")


def victims(token: str, pred) -> list[int]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if token in " ".join(p.info["cmdline"] or ()):
            try:
                if pred(p.environ()):
                    out.append(p.pid)
            except psutil.Error:
                pass
    return out


def warm_ranks(token: str) -> int:
    """The job's spares waiting with their imports done (elasticjob/spares.py: their thread is named so)."""
    n = 0
    for p in psutil.process_iter(["name", "cmdline"]):
        if p.info["name"] == "trainrun-warm" and token in " ".join(p.info["cmdline"] or ()):
            n += 1
    return n


def time_to_kill(step: int, token: str, warm: int, since: list[float]) -> bool:
    """At step KILL_AT or later, once `warm` spares are ready (a job that has trained a while has them; the
    first steps come before they are). BenchError if they are not ready WARM_WAIT s after KILL_AT."""
    if step < KILL_AT:
        return False
    if warm <= 0:
        return True
    since.append(time.monotonic())
    if warm_ranks(token) >= warm:
        return True
    if since[-1] - since[0] > WARM_WAIT:
        raise BenchError(f"{warm} warm rank(s) not ready {WARM_WAIT:.0f}s after step {KILL_AT} (found {warm_ranks(token)})")
    return False


def recovery(argv: list[str], env: dict, pred, cut=None, restore=None, timeout: float = 240.0,
             warm: int = 0) -> tuple[float, float | None]:
    """Start `argv`, at step KILL_AT (and once `warm` spares are ready) SIGKILL the processes whose environment
    satisfies `pred` (or call `cut`); return seconds from then to the first step of the restarted job, and to
    the moment trainrun (-v) started the next attempt (None for torchrun): what the launcher takes, the rest
    is rank start-up."""
    token = f"tok{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([*argv, token], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    relaunch: list[float] = []

    def watch_stderr():
        for line in proc.stderr:
            if re.search(r"attempt [1-9]\d*: job", line):
                relaunch.append(time.time())

    threading.Thread(target=watch_stderr, daemon=True).start()
    t_kill, since = None, []
    deadline = time.monotonic() + timeout
    try:
        for line in proc.stdout:
            if time.monotonic() > deadline:
                raise BenchError(f"no recovery within {timeout:.0f}s: {' '.join(argv[:6])}")
            m = STEP.search(line)
            if not m:
                continue
            step, _size, restart, t = int(m[1]), int(m[2]), int(m[3]), float(m[4])
            if t_kill is None and time_to_kill(step, token, warm, since):
                t_kill = time.time()
                if cut is not None:
                    cut()
                else:
                    pids = victims(token, pred)
                    if not pids:
                        raise BenchError("no victim process found")
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
            elif t_kill is not None and restart >= 1:
                return t - t_kill, (relaunch[0] - t_kill if relaunch else None)
        raise BenchError(f"job ended before recovering: {' '.join(argv[:8])}")
    finally:
        if restore is not None:
            restore()
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


PHASE_NAMES = ("detect", "stop the attempt", "back-off + plan", "to the rank's process", "interpreter + script",
               "import torch", "MPI world", "DistributedOptimizer + TorchState", "sync()", "first step")


def phases(argv: list[str], env: dict, pred, timeout: float = 240.0, warm: int = 0) -> dict[str, float]:
    """One recovery (as recovery()), cut into steps, in seconds: the kill to the launcher's first `rank N
    exited` line (detect), to its `restart` line (the attempt stopped: every rank and agent done), to `attempt
    1: job` (back-off, plan), to the new rank 0's process start, its script start, `import torch` ended, the
    MPI world up, its optimizer and state built, `state.sync()` ended (bench_elastic_worker.py, PHASES=1), its
    first step. The launcher's marks are when this process read its stderr lines (late by a read's delay)."""
    token = f"tok{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([*argv, token], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env, "PHASES": "1"}, start_new_session=True)
    marks: dict[str, float] = {}
    killed = threading.Event()

    def watch_stderr():
        for line in proc.stderr:
            if not killed.is_set():
                continue
            now = time.time()
            if "detect" not in marks and re.search(r"rank \d+ exited with", line):
                marks["detect"] = now
            elif "stop the attempt" not in marks and re.search(r"; restart \d+", line):
                marks["stop the attempt"] = now
            elif "back-off + plan" not in marks and re.search(r"attempt [1-9]\d*: job", line):
                marks["back-off + plan"] = now

    threading.Thread(target=watch_stderr, daemon=True).start()
    t_kill, rank, since = None, {}, []
    deadline = time.monotonic() + timeout
    try:
        for line in proc.stdout:
            if time.monotonic() > deadline:
                raise BenchError(f"no recovery within {timeout:.0f}s: {' '.join(argv[:6])}")
            if "phases restart" in line and t_kill is not None:
                rank = dict(kv.split("=") for kv in line.split("phases restart", 1)[1].split()[1:])
                continue
            m = STEP.search(line)
            if not m:
                continue
            step, restart, t = int(m[1]), int(m[3]), float(m[4])
            if t_kill is None and time_to_kill(step, token, warm, since):
                t_kill = time.time()
                killed.set()
                for pid in victims(token, pred):
                    os.kill(pid, signal.SIGKILL)
            elif t_kill is not None and restart >= 1:
                points = [t_kill, marks.get("detect"), marks.get("stop the attempt"), marks.get("back-off + plan"),
                          *(float(rank[k]) if k in rank else None for k in ("start", "script", "imported", "world", "built", "synced")), t]
                if None in points:
                    raise BenchError(f"a step of the recovery was not seen: {points}")
                return {name: b - a for name, a, b in zip(PHASE_NAMES, points, points[1:])}
        raise BenchError(f"job ended before recovering: {' '.join(argv[:8])}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def phase_table(rounds: int) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "launcher"), "STEPS": "400", "COMMIT_EVERY": "5", "STEP_PAUSE": "0.1",
           "GLOO_SOCKET_IFNAME": "lo", "MODE": "trainrun"}
    py = sys.executable
    scenarios = {
        "-np 4 --max-restarts 3, rank 3 killed, 4 restart warm": (
            [py, "-m", "trainrun", "-v", "-np", "4", "--max-restarts", "3", WORKER],
            lambda e: e.get("RANK") == "3" and "TRAINRUN_RESTART_COUNT" in e, 4),
        "the same, --no-warm-ranks": (
            [py, "-m", "trainrun", "-v", "-np", "4", "--max-restarts", "3", "--no-warm-ranks", WORKER],
            lambda e: e.get("RANK") == "3" and "TRAINRUN_RESTART_COUNT" in e, 0),
        "pipe hosts 2x2 --min-np 2, far2's ranks killed, 2 go on warm": (
            [py, PIPE, "-v", "-H", "far1:2,far2:2", "--min-np", "2", WORKER],
            lambda e: e.get("TRAINRUN_HOSTNAME") == "far2", 4),
    }
    got: dict[str, list[dict]] = {k: [] for k in scenarios}
    for r in range(rounds):
        for name, (argv, pred, warm) in scenarios.items():
            got[name].append(phases(argv, env, pred, warm=warm))
            print(f"round {r + 1}: {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in got[name][-1].items()),
                  file=sys.stderr, flush=True)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [PHASES_START, "## The restart path, step by step", "",
             f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average at the end: {load}; "
             f"`python scripts/bench_elastic.py --phases --rounds {rounds}`; medians of {rounds} (seconds)", "",
             "| step | " + " | ".join(got) + " |", "|---|" + "---:|" * len(got)]
    for step in PHASE_NAMES:
        lines.append(f"| {step} | " + " | ".join(f"{med([g[step] for g in runs]):.2f}" for runs in got.values()) + " |")
    lines.append("| **kill to next step** | " + " | ".join(f"**{med([sum(g.values()) for g in runs]):.2f}**"
                                                       for runs in got.values()) + " |")
    return lines + [PHASES_END]


PHASES_START, PHASES_END = "<!-- restart-phases: written by scripts/bench_elastic.py -->", "<!-- /restart-phases -->"


def commit_costs(env: dict, sizes=(1, 16, 64, 256)) -> dict[int, tuple[float, ...]]:
    """{MiB: (commit, memcpy, memcpy to two buffers in turn, xxh3, crc32, fastest commit, fastest memcpy, CPU time
    of commit, CPU time of memcpy)} in seconds, medians but the fastest (bench_commit_worker.py)."""
    worker = str(REPO / "scripts" / "bench_commit_worker.py")
    r = subprocess.run([sys.executable, "-m", "trainrun", "-np", "2", "--max-restarts", "1", worker,
                        ",".join(map(str, sizes))], capture_output=True, text=True, env=env, timeout=900)
    out = {}
    for line in r.stdout.splitlines():
        if "cost " in line:
            mib, *vals = line.split("cost ", 1)[1].split()
            out[int(mib)] = tuple(float(v) for v in vals)
    if len(out) != len(sizes):
        raise BenchError(f"commit benchmark failed: {r.stderr[-2000:]}")
    return out


def commit_table(costs) -> list[str]:
    from bench_common import cpu_model

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [COMMIT_START, "## commit() cost", "",
             f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {os.cpu_count()} vCPU {cpu_model()}; "
             f"load average at the end (1/5/15 min): {load}",
             "- `python scripts/bench_elastic.py --commit-only` (scripts/bench_commit_worker.py): `trainrun -np 2 "
             "--max-restarts 1`; a TorchState of a torch model of N MiB (1 MiB Linear layers); rank 0 (local rank 0) "
             "writes the host's /dev/shm segment, rank 1 keeps its own copy; no elastic sizing, so no host-update check "
             "(TRAINRUN_HOST_UPDATES=0; a job with --min-np or a discovery script adds one broadcast per commit). "
             "Beside it, in the same process and interleaved round by round: a plain memcpy of the same bytes "
             "(`np.copyto` into one warm buffer, and into two buffers in turn as a segment's two slots are written), "
             "and the payload checksums alone; a 50 ms pause before every timed call (the training step between commits; "
             "each call then starts with caches as cold as the others'), and a barrier before each commit's pause (a "
             "training step's allreduce lines the ranks up). Medians of 15 rounds, and the fastest of them; CPU: the "
             "calling thread's CPU time (thread_time), which leaves out the waits for a core on a loaded machine.", "",
             "| state (MiB) | commit() ms | ms/MiB | memcpy ms | commit / memcpy | memcpy, 2 buffers ms | commit / that | "
             "fastest commit / fastest memcpy (ms) | CPU: commit / memcpy (ms) | xxh3 ms | crc32 ms |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mib, (commit, copy, copy2, xxh, crc, cmin, mmin, ccpu, mcpu) in costs.items():
        lines.append(f"| {mib} | {commit * 1e3:.2f} | {commit * 1e3 / mib:.3f} | {copy * 1e3:.2f} | {commit / copy:.1f}x | "
                     f"{copy2 * 1e3:.2f} | {commit / copy2:.1f}x | {cmin / mmin:.1f}x ({cmin * 1e3:.2f} / {mmin * 1e3:.2f}) | "
                     f"{ccpu / mcpu:.1f}x ({ccpu * 1e3:.2f} / {mcpu * 1e3:.2f}) | {xxh * 1e3:.2f} | {crc * 1e3:.2f} |")
    return lines + [COMMIT_END]


def replace_section(text: str, section: list[str]) -> str:
    """`text` with the part between section[0] and section[-1] (its markers) replaced, or `section` appended."""
    start, end = section[0], section[-1]
    if start in text:
        head, _, rest = text.partition(start)
        tail = rest.partition(end)[2]
        return head + "\n".join(section) + tail
    return text.rstrip("\n") + "\n\n" + "\n".join(section) + "\n"


COMMIT_START, COMMIT_END = "<!-- commit-cost: written by scripts/bench_elastic.py -->", "<!-- /commit-cost -->"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cluster", action="store_true", help="also on 3 simulated hosts (takes the testbed lock)")
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "elastic.md"))
    ap.add_argument("--commit-only", action="store_true", help="only the commit() table (replaced in --out)")
    ap.add_argument("--phases", action="store_true", help="only the restart path step by step (replaced in --out)")
    ap.add_argument("--anchor-only", action="store_true",
                    help="of the one-machine scenarios only torchrun's (the anchor beside --cluster's), and no commit table")
    args = ap.parse_args()
    if args.commit_only or args.phases:
        if args.phases:
            section = phase_table(args.rounds)
        else:
            section = commit_table(commit_costs({**os.environ, "PYTHONPATH": str(REPO / "launcher")}))
        print("\n".join(section))
        out = Path(args.out)
        out.write_text(replace_section(out.read_text() if out.exists() else "", section))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="bench-elastic-"))
    env = {**os.environ, "PYTHONPATH": str(REPO / "launcher"), "STEPS": "400", "COMMIT_EVERY": "5",
           "STEP_PAUSE": "0.1", "CKPT": str(tmp / "ckpt.pt"), "GLOO_SOCKET_IFNAME": "lo"}
    py = sys.executable
    scenarios = {
        "trainrun --max-restarts 3 (4 ranks, 1 killed; 4 restart from the agents' copy, warm)": (
            [py, "-m", "trainrun", "-v", "-np", "4", "--max-restarts", "3", "-x", "MODE=trainrun", WORKER],
            lambda e: e.get("RANK") == "3" and "TRAINRUN_RESTART_COUNT" in e, 4),
        "trainrun elastic, pipe hosts (2x2, 1 host killed; 2 go on, warm)": (
            [py, PIPE, "-v", "-H", "far1:2,far2:2", "--min-np", "2", "-x", "MODE=trainrun", WORKER],
            lambda e: e.get("TRAINRUN_HOSTNAME") == "far2", 4),
        "torchrun --max-restarts 3 (4 ranks, 1 killed; 4 restart from a disk checkpoint)": (
            [os.path.join(os.path.dirname(py), "torchrun"), "--standalone", "--nproc-per-node", "4", "--max-restarts", "3",
             WORKER],
            lambda e: e.get("RANK") == "3" and e.get("MODE") == "torchrun", 0),
    }
    if args.anchor_only:
        scenarios = {k: v for k, v in scenarios.items() if k.startswith("torchrun")}
    times: dict[str, list[float]] = {k: [] for k in scenarios}
    relaunches: dict[str, list[float]] = {k: [] for k in scenarios}
    for r in range(args.rounds):
        for name, (argv, pred, warm) in scenarios.items():
            run_env = {**env, "MODE": "torchrun" if "torchrun" in name else "trainrun"}
            Path(env["CKPT"]).unlink(missing_ok=True)
            total, relaunch = recovery(argv, run_env, pred, warm=warm)
            times[name].append(total)
            if relaunch is not None:
                relaunches[name].append(relaunch)
            print(f"round {r + 1}: {name}: {total:.2f}s (relaunch {relaunch})", file=sys.stderr, flush=True)
    if args.cluster:
        with testbed_session(3) as tb:
            wrapper = tmp / "py.sh"
            wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={REPO / 'launcher'} exec {py} \"$@\"\n")
            wrapper.chmod(0o755)
            base = [py, "-m", "trainrun", "-v", "--ssh-config", str(tb.ssh_config), "--python", str(wrapper),
                    "--hostfile", str(tb.hostfile), "--min-np", "4", "-x", "MODE=trainrun"]
            links = ["h3-m", "h3-d"]

            def cut():
                for link in links:
                    subprocess.run(["ip", "-n", "trt-sw", "link", "set", link, "down"], check=True)

            def restore():
                for link in links:
                    subprocess.run(["ip", "-n", "trt-sw", "link", "set", link, "up"], check=False)

            host_kill = {"pred": lambda e: e.get("TRAINRUN_HOSTNAME") == "h3"}
            for name, extra, kw in (
                    ("trainrun elastic, 3 simulated hosts x 2, 1 host's ranks killed; 4 go on, warm", [],
                     {**host_kill, "warm": 6}),
                    ("the same, a host's ranks killed, --no-warm-ranks", ["--no-warm-ranks"], host_kill),
                    ("trainrun elastic, 3 simulated hosts x 2, 1 host's network cut (default --heartbeat-timeout 15: "
                     "the kernel ends the SSH connection); 4 go on, warm",
                     [], {"pred": None, "cut": cut, "restore": restore, "warm": 6}),
                    ("the same, a host's network cut, --no-warm-ranks", ["--no-warm-ranks"],
                     {"pred": None, "cut": cut, "restore": restore})):
                times[name], relaunches[name] = [], []
                for r in range(args.rounds):
                    total, relaunch = recovery([*base, *extra, WORKER], {**env, "MODE": "trainrun"}, **kw)
                    times[name].append(total)
                    relaunches[name] += [relaunch] if relaunch is not None else []
                    print(f"round {r + 1}: {name}: {total:.2f}s (relaunch {relaunch})", file=sys.stderr, flush=True)
    costs = None if args.anchor_only else commit_costs({**env})
    lines = ["# Elastic recovery and commit() cost", "", *machine_lines(), "",
             f"Time from SIGKILL of the victim (at step {KILL_AT}) to the first training step of the restarted job; "
             f"median of {args.rounds} round(s), rounds interleaved. `python scripts/bench_elastic.py"
             f"{' --cluster' if args.cluster else ''}{' --anchor-only' if args.anchor_only else ''} --rounds {args.rounds}`.", "",
             "The launcher's share is the time from the kill to trainrun starting the next attempt's ranks (detect, stop "
             "the others, wait for every agent's DONE, a 0.5 s back-off when the same hosts restart, plan, send the JOBs); "
             "the rest is the new ranks' start-up (a warm rank: the hand-off to a spare that imported torch, MPI_Init, "
             "`state.sync()`; a cold one also its interpreter and `import torch`) and one step. `warm`: the kill comes "
             "once every host's spares are ready.", "",
             "| scenario | kill to next step, median (s) | launcher's share, median (s) | rounds (s) |",
             "|---|---:|---:|---|"]
    for name, ts in times.items():
        share = f"{med(relaunches[name]):.2f}" if relaunches.get(name) else "-"
        lines.append(f"| {name} | {med(ts):.2f} | {share} | {', '.join(f'{t:.2f}' for t in ts)} |")
    if costs is not None:
        lines += ["", *commit_table(costs)]
    write_out("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as err:
        print(f"bench: {err}", file=sys.stderr)
        sys.exit(1)
