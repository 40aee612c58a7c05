"""A state as raw bytes plus a small pickled index: the payload of a commit (shm_slot.py) and of save().

pack(obj) walks `obj` with a pickler whose reducer_override takes out every array whose bytes can be copied
as they lie: a NumPy ndarray (exact type, no Python objects inside, C or Fortran contiguous) and a torch
Tensor or Parameter (exact type, CPU, strided, contiguous, not quantized; a Parameter comes back as one). TensorFlow variables reach it as the NumPy
arrays their states hand over. The pickle (the index) holds everything else and, in place of each array,
(kind, offset, nbytes, dtype, shape, flag). Other objects -- and arrays that do not qualify: non-contiguous
views, GPU tensors, subclasses -- are pickled as usual.

Payload layout: index length u64 | index | padding | arrays, each at a 64-byte aligned offset from the data
start (the first 64-byte boundary after the index). unpack() copies every array out (a slot is rewritten
two commits later; an optimizer keeps the tensors it loads), so the result owns its memory. One array object
met twice is laid out once and comes back as one object; distinct tensors that shared storage come back as
separate tensors (state_dict loading copies them in place anyway). An index names each raw array as a call of
`_raw_ref(kind, offset, ...)` that only unpack()'s unpickler resolves (older indexes: a persistent id).
"""
from __future__ import annotations

import io
import pickle
import struct
import sys
import weakref
from collections import OrderedDict

import numpy as np

_LEN = struct.Struct("<Q")
ALIGN = 64
PIECE = 1 << 20  # copy this much, then hash it while it is in cache


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _raw_numpy(obj):
    """obj's bytes as a uint8 view and ('nd', dtype, shape, fortran), or None when they cannot be copied raw."""
    if type(obj) is not np.ndarray or obj.dtype.hasobject:
        return None
    if obj.flags.c_contiguous:
        return obj.reshape(-1).view(np.uint8), ("nd", obj.dtype, obj.shape, False)
    if obj.flags.f_contiguous:
        return obj.T.reshape(-1).view(np.uint8), ("nd", obj.dtype, obj.shape, True)
    return None


def _raw_torch(obj):
    """As _raw_numpy, for a torch Tensor ('pt') or Parameter ('pp': it comes back as a Parameter)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if type(obj) is torch.Tensor:
        kind = "pt"
    elif type(obj) is torch.nn.Parameter:
        kind = "pp"
    else:
        return None
    # Fast path, one torch call: numpy() succeeds only for a CPU, strided, unquantized tensor without grad,
    # conjugate or negative bit, of a dtype NumPy has (whose names are torch's). A commit runs after a training
    # step has emptied the caches, where each torch call costs tens of microseconds: at 1 MiB this path made a
    # commit 0.1 ms faster than the five calls below (docs/benchmarks/elastic.md).
    try:
        arr = obj.numpy()
    except (RuntimeError, TypeError):
        arr = None
    if arr is not None and arr.flags.c_contiguous:
        return arr.reshape(-1).view(np.uint8), (kind, arr.dtype.name, arr.shape, False)
    if obj.device.type != "cpu" or obj.layout != torch.strided or obj.is_quantized or not obj.is_contiguous():
        return None
    if obj.is_conj() or obj.is_neg():
        return None
    flat = obj.detach().reshape(-1).view(torch.uint8)
    return flat.numpy(), (kind, str(obj.dtype).removeprefix("torch."), tuple(obj.shape), obj.requires_grad)


class Packed:
    """A state laid out for copying: `size` bytes; write_into() copies it into a buffer."""

    def __init__(self, index: bytes, arrays: list[tuple[int, np.ndarray]], data_start: int, size: int):
        self.index, self.arrays, self.data_start, self.size = index, arrays, data_start, size

    def write_into(self, dst: np.ndarray, hasher=None) -> None:
        """Copy the payload into `dst` (uint8, at least `size` bytes); `hasher.update()` then sees every byte
        of dst[:size] in order, each piece right after it was written (gaps: as they are in dst)."""
        head = _LEN.pack(len(self.index)) + self.index
        dst[:len(head)] = np.frombuffer(head, dtype=np.uint8)
        hashed = 0

        def hash_to(end: int) -> None:
            nonlocal hashed
            if hasher is not None and end > hashed:
                hasher.update(dst[hashed:end])
            hashed = max(hashed, end)

        for offset, src in self.arrays:
            at = self.data_start + offset
            n = src.size
            for start in range(0, n, PIECE):
                stop = min(n, start + PIECE)
                np.copyto(dst[at + start:at + stop], src[start:stop])
                hash_to(at + stop)
        hash_to(self.size)

    def to_array(self) -> np.ndarray:
        out: np.ndarray = np.empty(self.size, dtype=np.uint8)
        self.write_into(out)
        return out


def _raw_ref(*pid):
    """The stand-in that a packed index names for each raw array; only _Unpickler resolves it."""
    raise pickle.UnpicklingError("a packed state's index is read by trainrun.elastic.packing.unpack(), not pickle.loads")


class _Pickler(pickle.Pickler):
    """Raw arrays through reducer_override, not persistent_id: CPython calls reducer_override only for objects
    of no builtin type (a state_dict's str keys, ints, dicts, lists pass without a call into Python), where
    persistent_id is called for every object; each such call costs several microseconds after a training
    step has emptied the caches. An array met twice is laid out once (the pickle memo) and comes back as one."""

    def __init__(self, file):
        super().__init__(file, protocol=5)
        self.arrays: list[tuple[int, np.ndarray]] = []
        self.end = 0
        # id(tensor) -> (weakref, data_ptr, shape, dtype, raw): the tensors of the last dump and of this one
        self.views: dict[int, tuple] = {}
        self.seen: dict[int, tuple] = {}

    def reducer_override(self, obj):
        cls = type(obj)
        if cls is np.ndarray:
            raw = _raw_numpy(obj)
        elif cls.__name__ in ("Tensor", "Parameter"):
            raw = self._torch(obj)
        elif cls is OrderedDict:
            # a state_dict and its _metadata are OrderedDicts: pickled as their items (and attributes) through
            # the same global as the arrays, not through OrderedDict.__reduce__ and a second global, whose
            # first use after a training step costs ~0.06 ms each (a plain dict's pickling costs a third)
            # (an empty one, made and memoized first, then its items and attributes: a cycle through it is fine)
            return _raw_ref, ("od",), obj.__dict__ or None, None, iter(obj.items())
        else:
            return NotImplemented
        if raw is None:
            return NotImplemented
        flat, (kind, dtype, shape, flag) = raw
        offset = _align(self.end)
        self.arrays.append((offset, flat))
        self.end = offset + flat.size
        return _raw_ref, (kind, offset, flat.size, dtype, shape, flag)

    def _torch(self, obj):
        """_raw_torch(obj), or the view made for this same tensor at the last dump while its memory, shape and
        dtype are unchanged: a state that commits the same parameters (TorchState: the model's own, through
        state_dict(keep_vars=True), and the optimizer's state) then pays one data_ptr() call per tensor
        instead of numpy()'s (0.02 vs 0.09 ms each after a training step has emptied the caches)."""
        hit = self.views.get(id(obj))
        if hit is not None and hit[0]() is obj and obj.data_ptr() == hit[1] and obj.shape == hit[2] and obj.dtype is hit[3]:
            self.seen[id(obj)] = hit
            return hit[4]
        raw = _raw_torch(obj)
        if raw is not None:
            self.seen[id(obj)] = (weakref.ref(obj), obj.data_ptr(), obj.shape, obj.dtype, raw)
        return raw


class Packer:
    """pack() with one pickler kept between calls (a State commits the same shape of state again and again:
    making a pickler costs as much as pickling a small index, with caches cold)."""

    def __init__(self):
        self._buf = io.BytesIO()
        self._p = _Pickler(self._buf)

    def pack(self, obj) -> Packed:
        buf, p = self._buf, self._p
        buf.seek(0)
        buf.truncate()
        p.arrays, p.end = [], 0
        try:
            p.dump(obj)
        finally:
            p.clear_memo()  # holds the state's objects otherwise
            p.views, p.seen = p.seen, {}  # the tensors of this state only: views of others are let go
        index = buf.getvalue()
        data_start = _align(_LEN.size + len(index))
        return Packed(index, p.arrays, data_start, data_start + p.end)


def pack(obj) -> Packed:
    """Lay `obj` out (see the module doc). Arrays are referenced, not copied: write the result before they change."""
    return Packer().pack(obj)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, data: np.ndarray):
        super().__init__(file)
        self.data = data

    def find_class(self, module, name):
        if module == __name__ and name == "_raw_ref":
            return self._load
        return super().find_class(module, name)

    def persistent_load(self, pid):  # an index written before reducer_override (a segment of an older rank)
        return self._load(*pid)

    def _load(self, kind, *args):
        if kind == "od":  # its items and attributes follow (SETITEMS, BUILD)
            return OrderedDict()
        offset, nbytes, dtype, shape, flag = args
        src = self.data[offset:offset + nbytes]
        if kind == "nd":
            out = np.empty(shape[::-1] if flag else shape, dtype=dtype)
            np.copyto(out.reshape(-1).view(np.uint8), src)
            return out.T if flag else out
        if kind in ("pt", "pp"):
            import torch

            out = torch.empty(shape, dtype=getattr(torch, dtype))
            np.copyto(out.reshape(-1).view(torch.uint8).numpy(), src)
            if kind == "pp":
                return torch.nn.Parameter(out, requires_grad=bool(flag))
            return out.requires_grad_(flag) if flag else out
        raise pickle.UnpicklingError(f"unknown array kind {kind!r} in a packed state")


def unpack(payload) -> object:
    """The object pack() laid out into `payload` (bytes-like or a uint8 array); arrays are copied out."""
    data = payload if isinstance(payload, np.ndarray) else np.frombuffer(payload, dtype=np.uint8)
    (n,) = _LEN.unpack(data[:_LEN.size].tobytes())
    index = data[_LEN.size:_LEN.size + n].tobytes()
    return _Unpickler(io.BytesIO(index), data[_align(_LEN.size + n):]).load()
