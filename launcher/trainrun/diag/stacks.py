"""Taking the Python stacks (all threads) of processes on this host, and their typed form on the wire.

Two ways, tried in order for each process:
1. py-spy (`py-spy dump --pid P --json --native`; without `--native` if that fails): reads the process
   from outside with ptrace, so it works whatever the process is doing (blocked in C, holding the GIL).
   Needs ptrace rights on the target (same user or root, no Yama/seccomp block).
2. faulthandler: a rank whose runtime was initialized registered `faulthandler.register(SIGUSR2, ...)`
   writing to a file it announced (rankhook.py); we send SIGUSR2 and read what was appended. No ptrace
   needed; the dump comes from a C-level signal handler, so it also works while the rank waits in MPI.
   SIGUSR2 is only ever sent to a process that announced the hook (its default action would kill it).

`take_stacks` runs them for many processes in parallel and never raises: a process whose stack cannot be
taken gets a RankStack with `error` saying why. Before either, each process's state is read from
/proc/PID/stat: a process that is stopped (T, t), a zombie (Z) or in uninterruptible sleep (D) cannot
answer (py-spy fails or waits for it, its faulthandler never runs), so its RankStack says that state
(`state`, `error`: "is stopped (state T)") and neither way is tried.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import NamedTuple

PY_SPY_TIMEOUT_S = 10.0
FAULTHANDLER_WAIT_S = 3.0


@dataclass(frozen=True)
class Frame:
    name: str
    file: str
    line: int
    native: bool = False  # a C/C++ frame (py-spy --native): file is the library, line 0


@dataclass(frozen=True)
class ThreadStack:
    name: str
    main: bool
    frames: tuple[Frame, ...]  # innermost first


@dataclass(frozen=True)
class RankStack:
    """One rank's stacks as its host took them. `method`: "py-spy" or "faulthandler" ("" with `error`)."""

    rank: int
    host: str
    pid: int
    method: str
    threads: tuple[ThreadStack, ...] = ()
    text: str = ""
    error: str = ""
    state: str = ""  # the process's /proc state letter when it cannot answer (T, t, Z, D, X), else ""

    def main_thread(self) -> ThreadStack | None:
        return next((t for t in self.threads if t.main), self.threads[0] if self.threads else None)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RankStack:
        threads = tuple(ThreadStack(t["name"], t["main"], tuple(Frame(**f) for f in t["frames"])) for t in d["threads"])
        return cls(d["rank"], d["host"], d["pid"], d["method"], threads, d["text"], d["error"], d.get("state", ""))


class HookInfo(NamedTuple):
    """What a rank's runtime announced (rankhook.py): its pid, main thread id, faulthandler file."""

    pid: int
    main_ident: int
    path: str


# --- where a host's faulthandler files live -------------------------------------------------------------
class Target(NamedTuple):
    rank: int
    host: str
    pid: int                 # the rank's process (the hook's pid is preferred when announced)
    hook: HookInfo | None


# states in which a process cannot run: neither py-spy (it stops the process) nor a signal handler answers
SILENT_STATES = {
    "T": "is stopped (state T)",
    "t": "is stopped by a tracer (state t)",
    "Z": "is a zombie (state Z): it exited and was not reaped",
    "X": "is dead (state X)",
    "D": "is in uninterruptible sleep (state D): blocked in the kernel (disk, network filesystem, device)",
}


def proc_state(pid: int) -> str:
    """The state letter of `pid` from /proc/PID/stat ("R", "S", "T", ...); "" if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def find_py_spy() -> str | None:
    """The py-spy next to this interpreter (a venv's bin/), else on PATH."""
    here = os.path.dirname(sys.executable)
    return shutil.which("py-spy", path=os.pathsep.join([here, os.environ.get("PATH", "")]))


def parse_py_spy(doc: list) -> tuple[ThreadStack, ...]:
    """py-spy's --json output -> threads (the main thread first)."""
    threads = []
    for t in doc:
        frames = tuple(Frame(f["name"], f.get("filename") or f.get("short_filename") or "?", int(f.get("line") or 0),
                             native=f.get("module") is not None) for f in t.get("frames", ()))
        main = t.get("thread_name") == "MainThread" or t.get("os_thread_id") == t.get("pid")
        threads.append(ThreadStack(t.get("thread_name") or f"thread {t.get('os_thread_id')}", main, frames))
    threads.sort(key=lambda t: not t.main)
    return tuple(threads)


_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):")
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def parse_faulthandler(text: str, main_ident: int | None = None) -> tuple[ThreadStack, ...]:
    """faulthandler's all-threads dump -> threads (the main thread, by its ident, first)."""
    threads: list[ThreadStack] = []
    frames: list[Frame] = []
    name: str | None = None

    def close():
        if name is not None:
            threads.append(ThreadStack(name, main_ident is not None and int(name, 16) == main_ident, tuple(frames)))

    for line in text.splitlines():
        if m := _FH_THREAD.match(line):
            close()
            name, frames = m.group(2), []
        elif (m := _FH_FRAME.match(line)) and name is not None:
            frames.append(Frame(m.group(3), m.group(1), int(m.group(2))))
    close()
    threads.sort(key=lambda t: not t.main)
    return tuple(threads)


def render_text(stack: RankStack) -> str:
    """A py-spy-like text of all threads (what goes to --output-dir)."""
    lines = [f"rank {stack.rank} on {stack.host}, pid {stack.pid} ({stack.method or 'no stack'})"]
    if stack.error:
        lines.append(f"  {stack.error}")
    for t in stack.threads:
        lines.append(f"Thread {t.name}{' (main)' if t.main else ''}:")
        lines += [f"    {f.name} ({os.path.basename(f.file)})" if f.native else f"    {f.name} ({f.file}:{f.line})"
                  for f in t.frames]
    return "\n".join(lines) + "\n"


def _py_spy_start(py_spy: str, pid: int, native: bool) -> subprocess.Popen:
    argv = [py_spy, "dump", "--pid", str(pid), "--json"] + (["--native"] if native else [])
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def _py_spy_finish(proc: subprocess.Popen, deadline: float) -> tuple[tuple[ThreadStack, ...] | None, str]:
    try:
        out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, "py-spy timed out"
    if proc.returncode == 0:
        try:
            return parse_py_spy(json.loads(out)), ""
        except (ValueError, KeyError, TypeError) as e:
            return None, f"py-spy output not understood ({e})"
    first = err.decode(errors="replace").strip().splitlines()
    return None, f"py-spy: {first[0] if first else f'exit {proc.returncode}'}"


def _faulthandler(target: Target) -> tuple[tuple[ThreadStack, ...] | None, str]:
    hook = target.hook
    assert hook is not None  # take_stacks asks faulthandler only of a rank whose hook announced itself
    try:
        start = os.path.getsize(hook.path)
        os.kill(hook.pid, signal.SIGUSR2)
    except OSError as e:
        return None, f"faulthandler: {e.strerror}"
    deadline, size, stable_since = time.monotonic() + FAULTHANDLER_WAIT_S, start, time.monotonic()
    while time.monotonic() < deadline:  # the handler writes in pieces: wait until the file stops growing
        time.sleep(0.05)
        now_size = os.path.getsize(hook.path) if os.path.exists(hook.path) else start
        if now_size != size:
            size, stable_since = now_size, time.monotonic()
        elif size > start and time.monotonic() - stable_since >= 0.2:
            break
    if size <= start:
        return None, "faulthandler: no dump written"
    with open(hook.path, "rb") as f:
        f.seek(start)
        text = f.read(size - start).decode(errors="replace")
    return parse_faulthandler(text, hook.main_ident), ""


def take_stacks(targets: list[Target], py_spy: str | None) -> list[RankStack]:
    """The stacks of `targets` (py-spy first when `py_spy` is a path, then faulthandler), in parallel."""
    deadline = time.monotonic() + PY_SPY_TIMEOUT_S
    results: dict[int, RankStack] = {}
    errors: dict[int, list[str]] = {t.rank: [] for t in targets}
    for t in targets:
        pid = t.hook.pid if t.hook else t.pid
        state = proc_state(pid)
        if state in SILENT_STATES:
            results[t.rank] = RankStack(t.rank, t.host, pid, "", error=SILENT_STATES[state], state=state)
    if py_spy:
        for native in (True, False):
            todo = [t for t in targets if t.rank not in results]
            procs = [(t, pid, _py_spy_start(py_spy, pid, native)) for t in todo for pid in [t.hook.pid if t.hook else t.pid]]
            for t, pid, proc in procs:
                threads, error = _py_spy_finish(proc, deadline)
                if threads is not None:
                    results[t.rank] = RankStack(t.rank, t.host, pid, "py-spy", threads)
                elif not native:
                    errors[t.rank].append(error)
    else:
        for t in targets:
            errors[t.rank].append("py-spy not used")
    for t in targets:
        if t.rank in results:
            continue
        if t.hook is None:
            errors[t.rank].append("no faulthandler (the rank has not initialized the trainrun runtime)")
            results[t.rank] = RankStack(t.rank, t.host, t.pid, "", error="; ".join(errors[t.rank]))
            continue
        threads, error = _faulthandler(t)
        if threads is not None:
            results[t.rank] = RankStack(t.rank, t.host, t.hook.pid, "faulthandler", threads)
        else:
            errors[t.rank].append(error)
            results[t.rank] = RankStack(t.rank, t.host, t.pid, "", error="; ".join(errors[t.rank]))
    for t in targets:  # one that failed may have been stopped meanwhile: say so rather than why it failed
        s = results[t.rank]
        if s.error and not s.state and (state := proc_state(s.pid)) in SILENT_STATES:
            results[t.rank] = RankStack(t.rank, t.host, s.pid, "", error=SILENT_STATES[state], state=state)
    out = [results[t.rank] for t in targets]
    return [s if s.error else RankStack(s.rank, s.host, s.pid, s.method, s.threads, render_text(s)) for s in out]
