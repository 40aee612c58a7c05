"""Shared pieces of the launcher benchmarks (bench_hosts.py, bench_world.py): machine line, timing of one
command, interleaved rounds, medians, the simulated-host testbed held for the whole run, and the ssh
wrapper that lets MPICH's Hydra (`mpiexec -launcher ssh`) use the testbed's ssh config.

Not a test helper: these scripts print tables, they do not assert.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import testbed  # noqa: E402  (scripts/testbed.py)


class BenchError(Exception):
    """A benchmarked command failed, or the testbed could not be had; the message says which and why."""


def tool(name: str) -> str | None:
    path = BIN / name
    return str(path) if path.exists() else shutil.which(name)


def trainrun_argv() -> list[str]:
    t = tool("trainrun")
    return [t] if t else [sys.executable, "-m", "trainrun"]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def versions(dists=("trainrun", "mpich", "mpi4py", "paramiko")) -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = [f"Python {platform.python_version()}"]
    for dist in dists:
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            pass
    return ", ".join(parts)


def machine_lines() -> list[str]:
    """Markdown bullet lines: date, machine (nproc, CPU model, load average now), software."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"- date: {now}",
        f"- machine: nproc {len(os.sched_getaffinity(0))}, {cpu_model()}, {platform.system()} {platform.release()}; "
        f"load average at start (1/5/15 min): {load}",
        f"- software: {versions()}",
    ]


def bench_env(pycache: str) -> dict[str, str]:
    """The launchers' environment: bytecode cached under `pycache` (as for an installed package) even where
    PYTHONDONTWRITEBYTECODE is set, so an editable install does not recompile trainrun on every start."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def time_once(argv: list[str], env: dict[str, str], timeout: float = 120) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of argv (stdout discarded); BenchError with its stderr if it
    fails. CPU = user + sys of the command and the descendants it waited for (the launcher and its local
    children: ranks, ssh clients); processes that sshd starts on a simulated host are not counted."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{' '.join(argv)}: no exit within {timeout} s") from None
    elapsed = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()[-3000:]
        raise BenchError(f"{' '.join(argv)} failed (rc {proc.returncode}):\n{err}")
    return elapsed, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def run_rounds(cmds: dict[str, list[str]], env: dict[str, str], rounds: int, warmup: int = 1,
               progress: bool = True) -> tuple[dict, dict]:
    """Each round runs every command once, the order rotated from round to round (so drift on a shared box
    hits all alike); `warmup` untimed runs of each first. Returns ({name: [wall s per round]}, {name: [CPU s per round]})."""
    names = list(cmds)
    for _ in range(warmup):
        for name in names:
            time_once(cmds[name], env)
    samples: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        k = (r * max(1, len(names) // max(1, rounds))) % len(names)
        t0 = time.perf_counter()
        for name in names[k:] + names[:k]:
            wall, used = time_once(cmds[name], env)
            samples[name].append(wall)
            cpu[name].append(used)
        if progress:
            print(f"  round {r + 1}/{rounds}: {time.perf_counter() - t0:.1f} s, load {os.getloadavg()[0]:.1f}",
                  file=sys.stderr, flush=True)
    return samples, cpu


def med(xs: list[float]) -> float:
    return statistics.median(xs)


@contextlib.contextmanager
def testbed_session(n: int, wait: float = 600.0):
    """A testbed of n hosts, held (lock taken) for the whole block and brought down after it, whatever
    happens. Waits up to `wait` seconds while another session holds the lock or has a testbed up."""
    reason = testbed.missing_requirement()
    if reason:
        raise BenchError(f"testbed: {reason}")
    deadline, said = time.monotonic() + wait, False
    while True:
        fd = testbed.lock(blocking=False)
        if fd is not None and not testbed.namespaces():
            break
        if fd is not None:
            os.close(fd)
        if time.monotonic() > deadline:
            raise BenchError(f"testbed busy for {wait:.0f} s (lock {testbed.LOCK_FILE} or a testbed left up)")
        if not said:
            print("bench: testbed in use by another session; waiting", file=sys.stderr, flush=True)
            said = True
        time.sleep(3)
    try:
        try:
            tb = testbed.up(n, owner=f"bench pid {os.getpid()}")
            yield tb
        finally:
            left = testbed.down()
            if left:
                print(f"bench: testbed down left {left}", file=sys.stderr)
    finally:
        os.close(fd)


def ssh_wrapper(tmp: Path, ssh_config: Path) -> str:
    """An executable for Hydra's -launcher-exec: ssh with the testbed's config."""
    path = tmp / "ssh-testbed"
    path.write_text(f'#!/bin/sh\nexec ssh -F {ssh_config} "$@"\n')
    path.chmod(0o755)
    return str(path)


def hostfiles(tmp: Path, names: list[str], counts: tuple[int, ...], ppns: tuple[int, ...]) -> dict:
    """{(n, ppn): (trainrun hostfile, hydra hostfile)} for the first n hosts with ppn slots each."""
    out = {}
    for n in counts:
        for ppn in ppns:
            tr, hy = tmp / f"hosts-{n}x{ppn}.txt", tmp / f"hydra-{n}x{ppn}.txt"
            tr.write_text("".join(f"{h} slots={ppn}\n" for h in names[:n]))
            hy.write_text("".join(f"{h}:{ppn}\n" for h in names[:n]))
            out[n, ppn] = (str(tr), str(hy))
    return out


def write_out(text: str, out: str | None) -> None:
    """Print the report, and write it to `out` too unless that is None."""
    print(text)
    if out is None:
        return
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"written to {path}", file=sys.stderr)


def fmt_us(us: float) -> str:
    """A time in microseconds as "12.3 us" or, from 1 ms, "4.56 ms"."""
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} us"


def fmt_size(n: int) -> str:
    """A message size in bytes as "4 KiB" or, from 1 MiB, "16 MiB"."""
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def interleaved_samples_us(fns, iters: int, barrier, warmup: int = 3, settle=None) -> list[list[float]]:
    """Per-iteration times (us) of each of `fns` over `iters` iterations. Every iteration runs each contender
    once, each call right after `barrier()` (all ranks in step), so a load burst on a shared machine hits all
    of them alike; `settle`, if given, runs untimed before each call."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times = [[] for _ in fns]
    for _ in range(iters):
        for fn, ts in zip(fns, times):
            if settle is not None:
                settle()
            barrier()
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e6)
    return times


def interleaved_medians_us(fns, iters: int, barrier, warmup: int = 3) -> list[float]:
    """The median of each contender's interleaved_samples_us."""
    return [statistics.median(ts) for ts in interleaved_samples_us(fns, iters, barrier, warmup)]


def iters_for(nbytes: int, quick: bool, quick_min: int = 3) -> int:
    """Iterations for a message of `nbytes`: ~1 GiB moved, at least 15 (a median of fewer is noise here), at most 300."""
    n = max(15, min(300, (1 << 30) // max(nbytes, 1) // 8))
    return max(quick_min, n // 5) if quick else n
