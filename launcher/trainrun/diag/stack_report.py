"""The launcher's view of a stack dump: ranks grouped by identical main-thread stack, one headline per
group, and each rank's full dump written to --output-dir. Pure but for `write_dumps`.

    stacks of 4 ranks (SIGUSR1): 2 different
    ranks 0,2,3: allreduce <- main (work.py:14)
        allreduce (.../trainrun/numpy.py:120)
        main (work.py:14)
        <module> (work.py:20)
    rank 1: slow_step (work.py:8) <- main (work.py:12)
        ...
    rank 5 is stopped (state T)

A rank whose process cannot answer is named by its /proc state (stacks.SILENT_STATES), not as a failure
to take its stack.

A group's key is its main thread's Python frames (function, file, line) from the outermost frame in
trainrun's own code (the API call the program made, e.g. `allreduce`) outwards: ranks waiting in the
same call from the same line group together, wherever the runtime's polling loop happens to be, and
whatever their other threads do. Native frames are left out of the key (their addresses differ). The
full dumps (all threads, every frame) go to --output-dir. The headline names the call and its caller.
"""
from __future__ import annotations

import os
import re
from typing import Sequence

from trainrun.diag.stacks import Frame, RankStack
from trainrun.rankset import describe_ranks

SHOWN_FRAMES = 12  # frames of each group printed under its headline (innermost first)
_OURS = re.compile(r"[/\\]trainrun[/\\](runtime|torch|keras|diag|numpy\.py)")


def _python_frames(stack: RankStack) -> tuple[Frame, ...]:
    main = stack.main_thread()
    return tuple(f for f in main.frames if not f.native) if main else ()


def _where(f: Frame) -> str:
    return f"{f.name} ({os.path.basename(f.file)}:{f.line})"


def program_frames(frames: tuple[Frame, ...]) -> tuple[tuple[Frame, ...], bool]:
    """The frames from the outermost one in trainrun's own code outwards, and whether there was one
    (else all frames): what the program did, without the runtime's internals."""
    ours = [i for i, f in enumerate(frames) if _OURS.search(f.file)]
    return (frames[ours[-1]:], True) if ours else (frames, False)


def in_trainrun_call(stack: RankStack) -> bool:
    """Whether the rank's main thread is inside a call into trainrun (e.g. waiting in an allreduce)."""
    return not stack.error and program_frames(_python_frames(stack))[1]


def headline(frames: tuple[Frame, ...]) -> str:
    """"allreduce <- step (train.py:42)": the call into trainrun and its caller, else the two innermost frames."""
    if not frames:
        return "no Python frames"
    cut, ours = program_frames(frames)
    if ours:
        return cut[0].name + "".join(f" <- {_where(f)}" for f in cut[1:2])
    return " <- ".join(_where(f) for f in frames[:2])


def _key(frames: tuple[Frame, ...]) -> tuple:
    cut, ours = program_frames(frames)
    head = [(cut[0].name, os.path.basename(cut[0].file), 0)] if ours else []
    return tuple(head + [(f.name, f.file, f.line) for f in cut[1 if ours else 0:]])


def group_stacks(stacks: list[RankStack]) -> list[tuple[list[int], RankStack]]:
    """[(ranks, a representative stack)] by identical main-thread Python stack (or identical error);
    the largest group first, then by lowest rank."""
    groups: dict[tuple, list[RankStack]] = {}
    for s in stacks:
        key = ("error", s.error) if s.error else _key(_python_frames(s))
        groups.setdefault(key, []).append(s)
    out = [(sorted(s.rank for s in members), members[0]) for members in groups.values()]
    out.sort(key=lambda g: (-len(g[0]), g[0][0]))
    return out


def render(stacks: list[RankStack], reason: str, missing: Sequence[int] = ()) -> str:
    """The text printed on the launcher's stderr."""
    groups = group_stacks(stacks)
    lines = [f"trainrun: stacks of {len(stacks)} rank(s) ({reason}): {len(groups)} different"]
    for ranks, s in groups:
        who = describe_ranks(ranks)
        if s.state:  # "is stopped (state T)": "ranks 1,3 are stopped (state T)"
            lines.append(f"{who} {'are' if len(ranks) > 1 else 'is'} {s.error.removeprefix('is ')}")
            continue
        if s.error:
            lines.append(f"{who}: no stack: {s.error}")
            continue
        frames = _python_frames(s)
        main = s.main_thread()
        if not frames and main is not None and main.frames:  # e.g. in MPI_Finalize after the interpreter ended
            lines.append(f"{who}: no Python frames; native: " + " <- ".join(f.name for f in main.frames[:4]))
            continue
        lines.append(f"{who}: {headline(frames)}")
        cut, ours = program_frames(frames)
        if ours:
            lines.append(f"    {cut[0].name} ({os.path.basename(cut[0].file)}, {len(frames) - len(cut)} frame(s) inside)")
        lines += [f"    {_where(f)}" for f in cut[1 if ours else 0:SHOWN_FRAMES]]
        if len(cut) > SHOWN_FRAMES:
            lines.append(f"    ... {len(cut) - SHOWN_FRAMES} outer frame(s)")
    if missing:
        lines.append(f"{describe_ranks(missing)}: no answer from their host")
    return "\n".join(lines) + "\n"


def write_dumps(output_dir: str, stacks: list[RankStack], seq: int) -> list[str]:
    """DIR/rank.N/stacks.SEQ.txt for every rank (all threads, native frames where taken); returns the paths."""
    paths = []
    for s in stacks:
        d = os.path.join(output_dir, f"rank.{s.rank}")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"stacks.{seq}.txt")
        with open(path, "w") as f:
            f.write(s.text or (f"rank {s.rank} on {s.host}, pid {s.pid}, {s.error}\n" if s.state
                               else f"rank {s.rank} on {s.host}: no stack: {s.error}\n"))
        paths.append(path)
    return paths
