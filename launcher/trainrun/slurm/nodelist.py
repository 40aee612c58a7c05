"""Slurm's compressed lists, expanded: host lists (SLURM_JOB_NODELIST) and count lists (SLURM_TASKS_PER_NODE,
SLURM_JOB_CPUS_PER_NODE).

Host lists, as `scontrol show hostnames` expands them (22.05, checked against it in tests/cluster):
    h1,h2                 plain names, comma-separated (empty items are skipped)
    h[1-3,7]              ranges and single numbers in brackets, commas inside brackets do not split names
    gpu-[01-04]           zero padding: every number is as wide as the range's low bound (`[9-011]` -> 9,10,11)
    r[1-2]n[01-02]        several bracket groups in one name: their product, the first group outermost
                          (r1n01 r1n02 r2n01 r2n02)
    n[1-2]-ib             text after a bracket (Slurm 22.05's scontrol refuses it with one group; newer Slurm
                          and this parser accept it)
Count lists: `2(x3),1` is 2,2,2,1 (N(xK) repeats N K times).

Errors are ValueError with a one-line message saying what is wrong; callers add which variable held it.
"""
from __future__ import annotations

import itertools
import re

MAX_NAMES = 1_000_000   # a typo like h[1-1000000000] must fail, not fill the memory

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def split_top_level(text: str) -> list[str]:
    """`text` split at the commas outside brackets; raises ValueError for unbalanced brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            if depth:
                raise ValueError(f"nested '[' at position {i}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise ValueError(f"']' without '[' at position {i}")
            depth = 0
        elif ch == "," and not depth:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("'[' without ']'")
    items.append(text[start:])
    return items


def _numbers(group: str) -> list[str]:
    """The numbers of one bracket group's body (`1-3,07`), as strings with their padding."""
    out: list[str] = []
    for part in group.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise ValueError(f"bad range {part!r} in [{group}]: expected N or N-M with digits")
        lo_text, hi_text = m.group(1), m.group(2)
        lo = int(lo_text)
        hi = int(hi_text) if hi_text is not None else lo
        if hi < lo:
            raise ValueError(f"range {part!r} in [{group}] goes down")
        if len(out) + hi - lo + 1 > MAX_NAMES:
            raise ValueError(f"[{group}] names more than {MAX_NAMES} hosts")
        width = len(lo_text)
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out


def _expand_name(item: str) -> list[str]:
    """One top-level item (`r[1-2]n[01-02]`) expanded; the first bracket group varies slowest."""
    pieces = re.split(r"\[([^\]]*)\]", item)   # literal, group, literal, group, ..., literal
    choices = [[p] if i % 2 == 0 else _numbers(p) for i, p in enumerate(pieces)]
    total = 1
    for c in choices:
        total *= len(c)
    if total > MAX_NAMES:
        raise ValueError(f"{item!r} names more than {MAX_NAMES} hosts")
    return ["".join(parts) for parts in itertools.product(*choices)]


def expand_nodelist(text: str) -> list[str]:
    """Host names of a Slurm host list, in Slurm's order (duplicates kept, as scontrol keeps them).

    >>> expand_nodelist("h[1-3,7],gpu-[01-02]")
    ['h1', 'h2', 'h3', 'h7', 'gpu-01', 'gpu-02']
    """
    names: list[str] = []
    for item in split_top_level(text.strip()):
        item = item.strip()
        if not item:
            continue
        if any(ch.isspace() for ch in item):
            raise ValueError(f"blank inside host name {item!r}")
        names.extend(_expand_name(item))
        if len(names) > MAX_NAMES:
            raise ValueError(f"more than {MAX_NAMES} hosts")
    if not names:
        raise ValueError("no host in it")
    return names


def expand_counts(text: str) -> list[int]:
    """A Slurm count list expanded: `2(x3),1` -> [2, 2, 2, 1]. Counts must be >= 0, repeats >= 1.

    >>> expand_counts("2(x3),1")
    [2, 2, 2, 1]
    """
    out: list[int] = []
    for part in text.split(","):
        m = _COUNT.match(part.strip())
        if not m:
            raise ValueError(f"bad count {part.strip()!r}: expected N or N(xK)")
        repeat = int(m.group(2)) if m.group(2) is not None else 1
        if repeat < 1:
            raise ValueError(f"bad count {part.strip()!r}: repeat must be at least 1")
        if len(out) + repeat > MAX_NAMES:
            raise ValueError(f"more than {MAX_NAMES} counts")
        out.extend([int(m.group(1))] * repeat)
    return out
