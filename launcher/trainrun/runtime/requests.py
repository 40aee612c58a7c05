"""Validated Request builders shared by the NumPy and framework layers.

Each takes flat, contiguous storage arrays plus the tensor's shape and logical dtype name (see
fusion.py), checks what a rank can check alone (raising ValueError like Horovod), names unnamed ops
(`<kind>.noname.<slot>`, per process set: context.Session.next_name, so ranks calling in the same
order match and repeated calls reuse names the response cache knows), and returns Requests for an engine's `submit`
(state.engine(process_set)).
"""
from __future__ import annotations

import numpy as np

from trainrun.runtime.context import RUNTIME
from trainrun.runtime.fusion import REDUCIBLE
from trainrun.runtime.negotiation import JOIN_NAME
from trainrun.runtime.ops import GROUP, OP_NAMES, Adasum, Average, Max, Min, Product, Request, Sum


def auto_name(kind: str, name: str | None, set_id: int = 0) -> str:
    """`name`, or the next `<kind>.noname.<slot>` of this process set (ranks calling in the same
    order get the same names; an async op holds its slot until synchronized: api.submit)."""
    if name is None:
        return RUNTIME.current().next_name(kind, set_id)
    if not isinstance(name, str):
        raise ValueError(f"name must be a string, not {type(name).__name__}")
    return name


def check_op(op: int) -> int:
    """`op` if trainrun can run it, else ValueError naming the supported ones."""
    if op == Adasum:
        raise ValueError("op=Adasum is supported by allreduce (and its in-place and async forms) only")
    if op not in (Average, Sum, Min, Max, Product):
        raise ValueError(f"Unknown reduction op {op!r}; use one of {sorted(OP_NAMES.values())}")
    return op


def _check_reducible(dtype: str) -> None:
    if dtype not in REDUCIBLE:
        raise ValueError(f"Cannot reduce tensors of dtype {dtype}; supported: {', '.join(REDUCIBLE)}")


def check_dim(kind: str, shape: tuple) -> None:
    if len(shape) == 0:
        raise ValueError(f"{kind} needs a tensor with at least one dimension, got a scalar")


_OPS = frozenset((Average, Sum, Min, Max, Product))


def allreduce(inp, out, shape, dtype, name, op, prescale, postscale) -> Request:
    if dtype not in REDUCIBLE:
        _check_reducible(dtype)
    if op.__class__ is not int or op not in _OPS:
        check_op(op)
    return Request("allreduce", name, inp, out, shape if shape.__class__ is tuple else tuple(shape), dtype, op,
                   float(prescale), float(postscale))


def group(inps: list, outs: list, shapes: tuple, dtype: str, name: str, op, prescale, postscale,
          fused=None) -> Request:
    """A grouped allreduce of CPU arrays of one dtype as one Request (see ops.Request): inputs of
    any shape and layout, contiguous outputs; `fused`, when given, the buffer the outputs view."""
    _check_reducible(dtype)
    req = Request("allreduce", name, inps, outs, shapes, dtype, check_op(op), float(prescale),
                  float(postscale), splits=GROUP)
    req.fused = fused
    return req


def allgather(inp, shape, dtype, name) -> Request:
    check_dim("allgather", shape)
    return Request("allgather", name, inp, None, tuple(shape), dtype)


def broadcast(inp, out, shape, dtype, name, root_rank, size) -> Request:
    if not 0 <= root_rank < size:
        raise ValueError(f"root_rank {root_rank} is out of range for size {size}")
    return Request("broadcast", name, inp, out, tuple(shape), dtype, root=int(root_rank))


def alltoall(inp, shape, dtype, name, splits, n) -> Request:
    check_dim("alltoall", shape)
    if splits is None:
        if shape[0] % n:
            raise ValueError(f"alltoall without splits needs the first dimension ({shape[0]}) divisible by size ({n})")
        splits = [shape[0] // n] * n
    splits = tuple(int(s) for s in np.asarray(splits).reshape(-1))
    if len(splits) != n or min(splits, default=0) < 0 or sum(splits) != shape[0]:
        raise ValueError(f"alltoall splits {list(splits)} must be {n} non-negative counts summing to "
                         f"the first dimension ({shape[0]})")
    return Request("alltoall", name, inp, None, tuple(shape), dtype, splits=splits)


def reducescatter(inp, out, shape, dtype, name, op, prescale, postscale) -> Request:
    check_dim("reducescatter", shape)
    _check_reducible(dtype)
    return Request("reducescatter", name, inp, out, tuple(shape), dtype, check_op(op),
                   float(prescale), float(postscale))


def barrier(name: str) -> Request:
    return Request("barrier", name)


def join() -> Request:
    return Request("join", JOIN_NAME)
