"""Result buffers TensorFlow can adopt without a copy.

TF's kernels need 64-byte aligned memory (Eigen); an eager tensor made from a NumPy array through
DLPack shares the array's memory only if it is so aligned (else TF aborts the process on first use),
and NumPy's allocator aligns to 16 bytes. So eager results are written into buffers from here: 64-byte
aligned, and -- for large ones -- reused once no tensor refers to them any more, which saves the page
fault per 4 KiB that a fresh buffer costs on first write (more than a shared-memory reduction of it).
"""
from __future__ import annotations

import sys
import threading

import numpy as np
import tensorflow as tf

ALIGN = 64
POOL_MIN_BYTES = 1 << 16  # below this malloc reuses its memory anyway


def aligned(nbytes: int) -> np.ndarray:
    """A fresh uint8 array of `nbytes` whose data starts on an ALIGN boundary."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    off = (-raw.ctypes.data) % ALIGN
    return raw[off:off + nbytes]


class Pool:
    """Aligned byte buffers by size, a few kept per size; thread-safe."""

    KEEP = 4

    def __init__(self):
        self._bufs: dict[int, list] = {}
        self._lock = threading.Lock()

    def get(self, nbytes: int) -> np.ndarray:
        if nbytes < POOL_MIN_BYTES:
            return aligned(nbytes)
        with self._lock:
            bufs = self._bufs.setdefault(nbytes, [])
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
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    return _POOL.get(n * dtype.itemsize).view(dtype).reshape(shape)


def to_tensor(a: np.ndarray) -> tf.Tensor:
    """A tensor on `a`'s memory when it is aligned and DLPack can carry it; else a copy."""
    if a.ctypes.data % ALIGN == 0 and a.flags.c_contiguous and a.flags.writeable:
        try:
            return tf.experimental.dlpack.from_dlpack(a.__dlpack__())
        except (BufferError, TypeError, ValueError, tf.errors.OpError):
            pass
    return tf.convert_to_tensor(a)
