"""Dtypes on the wire, the fusion rule, and the fusion buffer: pack many tensors into one reduction
buffer and back.

Tensors arrive as flat, contiguous NumPy arrays in their *storage* dtype plus a *logical* dtype name;
they differ only for bfloat16 (NumPy has none: its storage is uint16 holding the bit pattern).
Reductions of 16-bit floats run in float32 (MPI has no half types; it is also more accurate than summing
in 16 bits); every other reducible dtype is reduced as itself. Pre/postscaling happen during the
copies in and out, so they cost no extra pass.

The fusion rule (`Fuser`, `fusion_of`) lives here once: the coordinator fuses negotiated ops with it,
every rank fuses cached ops with it (cache.py), so both agree by construction.
"""
from __future__ import annotations

import math
import sys
import threading
from typing import NamedTuple

import numpy as np

from trainrun.runtime.messages import FusionKey, Meta
from trainrun.runtime.ops import GROUP

REDUCIBLE = ("float16", "bfloat16", "float32", "float64",
             "int8", "uint8", "int16", "int32", "int64")
_STORAGE = {"bfloat16": np.dtype(np.uint16)}
_WIRE = {"float16": np.dtype(np.float32), "bfloat16": np.dtype(np.float32)}
WIDENED = frozenset(_WIRE)  # logical dtypes reduced in another (wider) dtype: they need a pack/unpack pass
_NAMES: dict[np.dtype, str] = {}


def dtype_name(dtype: np.dtype) -> str:
    """np.dtype -> logical name ('float32'); cached, as dtype.name is slow on the per-op path."""
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = dtype.name
    return name


def storage_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype that holds a tensor of logical dtype `dtype`."""
    d = _STORAGE.get(dtype)
    if d is None:
        d = _STORAGE[dtype] = np.dtype(dtype)
    return d


def wire_dtype(dtype: str) -> np.dtype:
    """The dtype a reduction of `dtype` runs in."""
    return _WIRE.get(dtype) or storage_dtype(dtype)


def fusion_of(meta: Meta) -> tuple[FusionKey | None, int]:
    """An allreduce's fusion key (None for a group: it always runs alone) and its bytes on the wire."""
    if meta.splits == GROUP:
        return None, 0
    return (FusionKey(meta.dtype, meta.op, meta.prescale, meta.postscale, meta.device),
            math.prod(meta.shape) * wire_dtype(meta.dtype).itemsize)


class Batch(NamedTuple):
    """Ops that run as one reduction: `key` None for a group (then `items` is that one op)."""
    key: FusionKey | None
    items: list


class Fuser:
    """The fusion rule: allreduces with one FusionKey, taken in the order given, run as one reduction
    while the fused buffer stays within `threshold` bytes; a group runs alone. Batches come out as
    they close (`add`/`add_all` return the ones an op closed) and then, from `rest`, the ones still
    open, in the order their keys first opened -- so callers can interleave other work in order."""

    def __init__(self, threshold: int):
        self._threshold = threshold
        self._open: dict[FusionKey, list] = {}  # key -> [items, bytes]

    def add(self, item, key: FusionKey | None, nbytes: int) -> Batch | None:
        """Take one op (key and bytes: `fusion_of`; any hashable stands for a FusionKey as long as
        equal keys get equal stand-ins); the batch it closed, if any."""
        closed = self.add_all(((item, key, nbytes),))
        return closed[0] if closed else None

    def add_all(self, entries) -> list[Batch]:
        """add() of each (item, key, nbytes) in turn, in one loop (the response cache plans a
        training step's hundreds of ops with it); the batches they closed, in order."""
        open_, threshold, closed = self._open, self._threshold, []
        for item, key, nbytes in entries:
            if key is None:
                closed.append(Batch(None, [item]))
                continue
            batch = open_.get(key)
            if batch is not None and batch[1] + nbytes > threshold:
                closed.append(Batch(key, batch[0]))
                batch = None
            if batch is None:
                open_[key] = [[item], nbytes]  # (a key reopened keeps its first place in `rest`)
            else:
                batch[0].append(item)
                batch[1] += nbytes
        return closed

    def rest(self) -> list[Batch]:
        out = [Batch(key, items) for key, (items, _) in self._open.items()]
        self._open.clear()
        return out


def pack(src: np.ndarray, dtype: str, dst: np.ndarray, scale: float) -> None:
    """dst (wire dtype) = src (storage of logical `dtype`) * scale. A scaled float16 is rounded back
    to float16 before the reduction, as Horovod's CPU ScaleBuffer does (product in float32, stored
    in the tensor's dtype); integers scale in float64 and truncate, as there."""
    if dtype == "float16" and scale != 1.0:
        np.multiply(src, np.float32(scale), out=dst, dtype=np.float32)  # (not in float16: NumPy would
        np.copyto(dst, dst.astype(np.float16))                          # round the factor to half too)
    elif dtype == "bfloat16":
        halves: np.ndarray = dst.view(np.uint16)  # little-endian: the bf16 bits are the high half of each float32
        halves[0::2] = 0
        halves[1::2] = src
        if scale != 1.0:
            dst *= scale
    elif scale != 1.0:
        np.multiply(src, scale, out=dst, casting="unsafe")
    else:
        np.copyto(dst, src, casting="unsafe")


def unpack(src: np.ndarray, dtype: str, dst: np.ndarray, scale: float) -> None:
    """dst (storage of `dtype`) = src (wire dtype) * scale, rounding to nearest even for bfloat16.

    `src` is scratch: it may be modified.
    """
    if scale != 1.0:
        np.multiply(src, scale, out=src, casting="unsafe")
    if dtype == "bfloat16":
        bits: np.ndarray = src.view(np.uint32)
        bits += ((bits >> 16) & 1) + 0x7FFF
        np.copyto(dst, src.view(np.uint16)[1::2])
    else:
        np.copyto(dst, src, casting="unsafe")


class FusionBuffer:
    """One growable scratch buffer per wire dtype, reused across cycles (owned by the engine thread)."""

    def __init__(self):
        self._bufs: dict[np.dtype, np.ndarray] = {}

    def get(self, dtype: np.dtype, count: int) -> np.ndarray:
        buf = self._bufs.get(dtype)
        if buf is None or buf.size < count:
            buf = np.empty(max(count, 1024), dtype=dtype)
            self._bufs[dtype] = buf
        return buf[:count]


class OutputPool:
    """Fresh output buffers without fresh pages: a few buffers per (dtype, size) are kept, and one is
    handed out again once nothing but the pool refers to it (the caller dropped every view of it).
    A newly allocated buffer costs a page fault per 4 KiB on first write, which on a 640 KiB group
    costs more than the reduction itself. Thread-safe."""

    KEEP = 4

    def __init__(self):
        self._bufs: dict[tuple, list] = {}
        self._lock = threading.Lock()

    def get(self, dtype: np.dtype, count: int) -> np.ndarray:
        if count * dtype.itemsize < 65536:  # small: malloc reuses its memory anyway
            return np.empty(count, dtype=dtype)
        key = (dtype, count)
        with self._lock:
            bufs = self._bufs.setdefault(key, [])
            for buf in bufs:
                if sys.getrefcount(buf) == 3:  # the list, `buf`, getrefcount's argument
                    return buf
            buf = np.empty(count, dtype=dtype)
            bufs.append(buf)
            if len(bufs) > self.KEEP:
                del bufs[0]
            return buf
