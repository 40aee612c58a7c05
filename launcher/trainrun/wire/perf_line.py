"""Window summaries of a rank's collectives for straggler detection (supervisor/straggler.py), sent on the
diag pipe by the diag thread (runtime/rankhook.py) once per WINDOW_S:

    perf WALL_MS WAIT_MS COLLECTIVES LAST STEPS BEFORE_MS BYTES RSS_MB GPU_MB

over the window: its length, the time user threads spent blocked in collectives (the rest is compute,
data loading included), the cached collectives run, how many of them this rank was the last to join
(its bit entered the agreement round that made the op ready everywhere; ties count for every rank in
them), and optimizer steps (torch DistributedOptimizer.synchronize; 0 without one: the launcher then
counts blocking waits, sent as a negative number), and the time from the end of each step to the next
backward's first gradient (the optimizer's first gradient hook: data loading and the forward pass,
before the step; the rest of compute, backward and the optimizer, is inside it; 0 without an optimizer),
the allreduce payload (the inputs' bytes, for the live view's throughput: supervisor/monitor.py), and the
rank's memory when the line is made: its resident set (/proc/self/statm) and, where torch has CUDA
initialised, the GPU memory torch allocated (0 otherwise). The launcher reads lines of 6 fields (older
ranks) as having no payload or memory figures. The engine keeps the counters as plain ints on its
hot path (a perf_counter_ns pair per blocking wait, a few int operations per round); this module only
reads and differences them, so the measurement costs the training step nothing more. TRAINRUN_STRAGGLER=0
turns the engine's measurement off (for A/B benchmarks); then no line is sent.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

WINDOW_S = 4.0  # short enough that a straggler is named within HORIZON_S (supervisor/straggler.py) of slowing


@dataclass(frozen=True)
class Counters:
    t_ns: int
    wait_ns: int
    waits: int
    collectives: int
    last: int
    steps: int
    before_ns: int
    reduced_bytes: int = 0


def read(engine, t_ns: int) -> Counters | None:
    """The engine's counters now (None when it does not measure)."""
    m = getattr(engine, "meter", None)  # (runtime/meter.py)
    if m is None or not m.on:
        return None
    return Counters(t_ns, m.wait_ns, m.waits, m.collectives, m.last, m.steps, m.before_ns, m.reduced_bytes)


def memory() -> tuple[int, int]:
    """(resident set, GPU memory allocated by torch) of this process in MiB; 0 where unknown. Cheap: one
    small /proc read, and torch only when the program imported it and initialised CUDA."""
    rss = 0
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
    except (OSError, ValueError, IndexError):
        pass
    gpu = 0
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            gpu = torch.cuda.memory_allocated() >> 20
    except Exception:  # a torch without CUDA, or one being torn down: no figure
        gpu = 0
    return rss, gpu


def line(before: Counters, now: Counters) -> str | None:
    """The `perf` line for the window between two readings; None for a window without collectives."""
    coll = now.collectives - before.collectives
    waits = now.waits - before.waits
    if coll <= 0 and waits <= 0:
        return None
    steps = now.steps - before.steps
    wall_ms = (now.t_ns - before.t_ns) // 1_000_000
    wait_ms = min(wall_ms, (now.wait_ns - before.wait_ns) // 1_000_000)
    before_ms = (now.before_ns - before.before_ns) // 1_000_000
    rss, gpu = memory()
    return (f"perf {wall_ms} {wait_ms} {max(coll, 0)} {now.last - before.last} {steps if steps > 0 else -waits} {before_ms} "
            f"{max(now.reduced_bytes - before.reduced_bytes, 0)} {rss} {gpu}")
