"""Adasum (Horovod's adaptive summation, op=Adasum) on the CPU, for any number of ranks.

Two gradients a and b combine as (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b: their sum when they are
orthogonal, their average when they are parallel, in between otherwise (a zero vector's coefficient
is 1). Ranks combine in a binary tree, as Horovod's recursive halving does for a power of two:
(r0 + r1) + (r2 + r3), ... With a world size that is not a power of two, the last rank of an odd
level goes up a level unchanged, e.g. for 3 ranks (r0 + r1) + r2 -- Horovod's CPU Adasum is defined
for powers of two; this is the same tree, extended.

trainrun runs it as an allgather of every rank's tensor followed by the same tree on every rank,
in float64 (so every rank gets bitwise the same result): it moves size x the data of a ring
reduction, which suits the gradients Adasum is used for on CPU clusters but not very large tensors.
Pure NumPy; api.py and trainrun.torch build the allgather.
"""
from __future__ import annotations

import numpy as np


def pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Adasum of two float64 vectors."""
    dot = float(np.dot(a, b))
    na, nb = float(np.dot(a, a)), float(np.dot(b, b))
    ca = 1.0 - dot / (2.0 * na) if na else 1.0
    cb = 1.0 - dot / (2.0 * nb) if nb else 1.0
    return ca * a + cb * b


def combine(rows: np.ndarray) -> np.ndarray:
    """Adasum of the rows of `rows` (ranks x elements, float64) by the binary tree above."""
    level = list(rows)
    while len(level) > 1:
        carried = [level[-1]] if len(level) % 2 else []
        level = [pair(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)] + carried
    return level[0]


def check_dtype(dtype: str) -> None:
    if dtype not in ("float16", "float32", "float64"):
        raise ValueError(f"op=Adasum needs a float16, float32 or float64 tensor, not {dtype}")


def finish(gathered: np.ndarray, size: int, prescale: float, postscale: float, out: np.ndarray) -> np.ndarray:
    """Write into `out` the Adasum of the allgathered rows (gathered: size x n of the tensor's dtype)."""
    rows: np.ndarray = gathered.reshape(size, -1).astype(np.float64)
    if prescale != 1.0:
        rows *= prescale
    result = combine(rows)
    if postscale != 1.0:
        result *= postscale
    np.copyto(out.reshape(-1), result, casting="unsafe")
    return out
