"""Rank sets as people write them: "0-7,9" <-> {0, 1, ..., 7, 9}. Pure.

Used by `--ranks` (parse), `--fold` (the `[0-7,9]` prefix of a folded line) and the stack dump's groups
("ranks 0,2-15: ...").
"""
from __future__ import annotations

from collections.abc import Iterable


def format_ranks(ranks: Iterable[int]) -> str:
    """Sorted, de-duplicated, runs of 3 or more consecutive ranks as a range: {0,1,2,3,5,6} -> "0-3,5,6"."""
    out: list[str] = []
    items = sorted(set(ranks))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        if j - i >= 2:
            out.append(f"{items[i]}-{items[j]}")
        else:
            out.extend(str(r) for r in items[i:j + 1])
        i = j + 1
    return ",".join(out)


def describe_ranks(ranks: Iterable[int]) -> str:
    """"rank 3" or "ranks 0,2-15"."""
    items = sorted(set(ranks))
    return f"rank {items[0]}" if len(items) == 1 else f"ranks {format_ranks(items)}"


def parse_ranks(text: str) -> frozenset[int]:
    """"0,3" / "0-7,9" -> the set. Raises ValueError naming the bad part."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"'{part}' is not a rank or a range of ranks (write e.g. 0,3 or 0-7,9)")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise ValueError(f"'{part}': the range ends before it starts")
        out.update(range(a, b + 1))
    return frozenset(out)
