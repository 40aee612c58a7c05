"""Result buffers TensorFlow can adopt without a copy.

TF's kernels need 64-byte aligned memory (Eigen); an eager tensor made from a NumPy array through
DLPack shares the array's memory only if it is so aligned (else TF aborts the process on first use),
and NumPy's allocator aligns to 16 bytes. So eager results are written into buffers from here: 64-byte
aligned, and reused once no tensor refers to them any more: for large ones that saves the page fault
per 4 KiB that a fresh buffer costs on first write (more than a shared-memory reduction of it), for
small ones the aligned allocation (~2 us, a third of a small eager allreduce's Python).
"""
from __future__ import annotations

import math
import sys
import threading

import numpy as np
import tensorflow as tf

ALIGN = 64


def aligned(nbytes: int) -> np.ndarray:
    """A fresh uint8 array of `nbytes` whose data starts on an ALIGN boundary."""
    raw: np.ndarray = np.empty(nbytes + ALIGN, np.uint8)
    off = (-raw.__array_interface__["data"][0]) % ALIGN  # (cheaper than .ctypes.data)
    return raw[off:off + nbytes]


class Pool:
    """Aligned byte buffers by size, a few kept per size; thread-safe."""

    KEEP = 4

    def __init__(self):
        self._bufs: dict[int, list] = {}
        self._lock = threading.Lock()

    def get(self, nbytes: int) -> np.ndarray:
        with self._lock:
            bufs = self._bufs.get(nbytes)
            if bufs is None:
                bufs = self._bufs[nbytes] = []
            for buf in bufs:
                # views of buf (the arrays handed out, the tensors on them) refer to buf.base, the
                # allocation; when only buf and getrefcount's argument do, nothing uses it
                if sys.getrefcount(buf.base) == 2:
                    return buf
            buf = aligned(nbytes)
            bufs.append(buf)
            if len(bufs) > self.KEEP:
                del bufs[0]
            return buf


_POOL = Pool()


def empty(shape: tuple, dtype: np.dtype) -> np.ndarray:
    """An aligned (pooled when large) array of `shape` and `dtype`."""
    dtype = np.dtype(dtype)
    return _POOL.get(math.prod(shape) * dtype.itemsize).view(dtype).reshape(shape)


def empty_like(a: np.ndarray) -> np.ndarray:
    """empty(a.shape, a.dtype), for an array (the eager allreduce's output)."""
    return _POOL.get(a.nbytes).view(a.dtype).reshape(a.shape)


def to_tensor(a: np.ndarray) -> tf.Tensor:
    """A tensor on `a`'s memory when it is aligned and DLPack can carry it; else a copy."""
    if a.__array_interface__["data"][0] % ALIGN == 0 and a.flags.c_contiguous and a.flags.writeable:
        return adopt(a)
    return tf.convert_to_tensor(a)


def adopt(a: np.ndarray) -> tf.Tensor:
    """A tensor on the memory of `a`, an array from `empty` (aligned, contiguous, writeable); a copy
    where DLPack cannot carry its dtype."""
    try:
        return _from_dlpack(a.__dlpack__())
    except (BufferError, TypeError, ValueError, tf.errors.OpError):
        return tf.convert_to_tensor(a)


_from_dlpack = tf.experimental.dlpack.from_dlpack
