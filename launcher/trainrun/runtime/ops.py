"""What an operation is: reduction op constants (Horovod's values), a rank's Request, and its Handle.

A Request is one rank's half of a collective: flat contiguous NumPy views of the input and (when the
caller knows its shape) the output, in storage dtype (see fusion.py), plus everything the ranks must
agree on (its `meta`). The engine owns both arrays until the handle completes. Also the two rules
every backend shares: Average is Sum then a scale (`sum_then_scale`), and how reducescatter splits
dim 0 (`split_rows`).
"""
from __future__ import annotations

import warnings
from typing import Any, Union

import numpy as np

from trainrun.runtime.messages import Meta

Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}

GROUP = "group"  # Request.splits of a group of allreduces (see Request)
KINDS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "barrier", "join", "shutdown", "abort")
_new_tuple = tuple.__new__

# A Request's input or output storage, by what it is (see Request): a flat contiguous NumPy array; a group's
# list of arrays; a flat torch CUDA tensor (device "cuda"). Any: the engine does not look inside.
Storage = Any
# Request.splits: alltoall's send counts, GROUP for a group, else None
Splits = Union[tuple, str, None]


def sum_then_scale(op: int, postscale: float, size: int) -> tuple[int, float]:
    """The (op, postscale) a backend runs for `op`: Average is Sum, then a scale by 1/size."""
    return (Sum, postscale / size) if op == Average else (op, postscale)


def split_rows(dim0: int, size: int) -> list[int]:
    """Rows of a reducescatter output per rank: the first dim0 % size ranks get one extra (Horovod)."""
    return [dim0 // size + (1 if r < dim0 % size else 0) for r in range(size)]


class Handle:
    """Completion of one Request: `result` or `error` is set before `done` turns True (read it after).

    Waiting is the engine's job (Engine.wait drives progress while it waits); `done` is a plain flag so
    that creating and completing a handle costs next to nothing.
    """

    __slots__ = ("done", "result", "error", "name")

    def __init__(self, name: str):
        self.done = False
        self.result = None
        self.error: BaseException | None = None
        self.name = name


class Request:
    """One rank's side of a named collective.

    kind: one of KINDS (for "abort" the name carries the reason). inp/out: flat contiguous storage
    arrays (out None when the engine allocates it: allgather, alltoall). shape: the input's shape.
    dtype: logical dtype name. op/prescale/postscale: reductions. root: broadcast. splits: alltoall
    send counts along dim 0, one per rank.
    A *group* (grouped_allreduce) is one Request for many CPU tensors of one dtype: inp and out are
    lists of arrays (inputs of any layout, outputs contiguous), shape the tuple of their shapes,
    splits = GROUP; negotiated as one entry, reduced as one fused buffer. `fused`, when set, is a flat
    buffer whose consecutive slices are the outputs (reduced in place there: nothing to unpack). Its
    result is the list of outputs.
    device: "cpu" (inp/out are NumPy arrays) or "cuda" (flat torch CUDA tensors, reduced with NCCL;
    `ready` is a torch.cuda.Event recorded on the producer's stream after the input was written).
    """

    __slots__ = ("kind", "name", "inp", "out", "shape", "dtype", "op", "prescale", "postscale", "root",
                 "splits", "device", "ready", "handle", "submitted", "fused", "_meta", "cid")

    def __init__(self, kind: str, name: str, inp: Storage = None, out: Storage = None,
                 shape: tuple = (), dtype: str = "", op: int = Sum, prescale: float = 1.0,
                 postscale: float = 1.0, root: int = -1, splits: Splits = None, device: str = "cpu",
                 ready=None):
        self.kind, self.name, self.inp, self.out, self.shape, self.dtype = kind, name, inp, out, shape, dtype
        self.op, self.prescale, self.postscale, self.root, self.splits = op, prescale, postscale, root, splits
        self.device, self.ready = device, ready
        self.handle = Handle(name)
        self.submitted = 0.0  # timeline only
        self._meta: Meta | None = None
        self.cid: int | None = None  # its id in the engine's response cache, once looked up there
        self.fused: np.ndarray | None = None  # a group's output buffer, when its outputs are views of one (see above)

    def meta(self) -> Meta:
        """What is sent to the coordinator (small, picklable, compared across ranks); made once.
        (Built with tuple's constructor: Meta's own __new__ is Python code, 3x slower per op.)"""
        m = self._meta
        if m is None:
            m = self._meta = _new_tuple(Meta, (self.name, self.kind, self.dtype, self.shape, self.op, self.prescale,
                                               self.postscale, self.root, self.splits, self.device))
        return m


def handle_average_backwards_compatibility(op, average):
    """Horovod's rule: `op` wins, `average` is deprecated, the default is Average."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning)
        return Average if average else Sum
    return Average
