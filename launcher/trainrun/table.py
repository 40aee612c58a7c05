"""The one text-table renderer (`--dry-run`, `--check`). Pure."""
from __future__ import annotations

from typing import Iterable, Sequence


def render_table(header: Sequence[str], rows: Iterable[Sequence[object]], indent: str = "") -> list[str]:
    """Lines of a left-aligned table, columns two spaces apart, no trailing blanks (a long last column, such
    as a command line, is never padded)."""
    cells = [tuple(map(str, header))] + [tuple(map(str, r)) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
