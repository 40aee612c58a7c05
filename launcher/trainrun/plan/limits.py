"""How big a job one launcher plans: the cap on ranks (and on one host's slots). Pure.

65536 ranks: well above the largest jobs one launcher process drives (every rank's output and PMI traffic
go through it; Horovod's own runs top out in the thousands), small enough that planning stays about a second
and a hundred MiB (docs/benchmarks/plan.md), and a typo such as `-H h1:1000000000` is refused in one line
instead of filling memory. TRAINRUN_MAX_RANKS raises (or lowers) it; scripts/bench_plan.py uses it for 100k.
"""
from __future__ import annotations

import os
from typing import Mapping

MAX_RANKS = 65536


def max_ranks(environ: Mapping[str, str] | None = None) -> int:
    """The cap: TRAINRUN_MAX_RANKS when it is a whole number >= 1, else MAX_RANKS."""
    text = (os.environ if environ is None else environ).get("TRAINRUN_MAX_RANKS", "")
    return int(text) if text.isdigit() and int(text) >= 1 else MAX_RANKS
