"""A group of CPU tensors of one dtype as one flat tensor: how grouped allreduces travel.

A grouped allreduce of many small tensors is dominated by per-tensor work, not by its data (160
gradients of 4 KiB: ~2 us of Python each against ~2 us of reduction). Here the whole group is copied
in with one call (`pack`), reduced as one tensor, and copied out or viewed with one more
(`unpack`, `views`), so the per-tensor Python left is a list of addresses.

For an in-place op, contiguous tensors are copied in and out by MPI's datatype engine over their
addresses (runtime/gather.py: memcpy speed; 160 x 4 KiB in ~28 us and out in ~30 us, plus ~47 us of
Python to list the addresses, against ~65 us for torch.cat and ~75 + ~240 us to split and copy back
with torch). Otherwise it concatenates along dim 0 when every tensor has the same dimensions after it (then
the concatenation's memory is the tensors' data back to back, row-major), else flattens each first
(torch's flatten_dense_tensors: slower, any shapes). Inputs need not be contiguous.
"""
from __future__ import annotations

import torch

from trainrun.runtime import gather

_flatten = torch._C._nn.flatten_dense_tensors
_unflatten = torch._C._nn.unflatten_dense_tensors


def pack(tensors: list, in_place: bool, out=None):
    """The group as a FlatTensors, or None when it cannot travel as one: empty, or not every tensor on
    the CPU with one dtype (the same on every rank of a correct program, so every rank takes the same
    path). One pass over the tensors checks them and, for an in-place op whose tensors are all
    contiguous, notes their blocks for MPI to copy. (Not for an out-of-place op: its result is views
    of `flat`, and torch makes those fastest from a concatenation along dim 0.) `out`: a 1-D tensor to
    reuse as `flat` for an in-place op when its dtype and length fit (a buffer kept across steps: a
    fresh 32 MiB tensor costs ~20 ms of page faults and zeroing each time), else a new one is made."""
    if not tensors:
        return None
    dtype = tensors[0].dtype
    addresses: list[int] | None = [] if in_place else None  # (None once a tensor is not contiguous)
    lengths: list[int] = []
    for t in tensors:
        if not t.is_cpu or t.dtype is not dtype:
            return None
        if addresses is not None:
            if t.is_contiguous():
                addresses.append(t.data_ptr())
                lengths.append(t.nbytes)
            else:
                addresses = None
    return FlatTensors(tensors, None if addresses is None else (tuple(addresses), tuple(lengths)), out)


class FlatTensors:
    """The group's data back to back in `flat` (1-D, contiguous, a new tensor). `_blocks`, when MPI
    gathered the tensors, is their (addresses, byte lengths) for the copy back; `_rows`, when they
    were concatenated along dim 0, is the concatenation `flat` views (it splits back into the
    tensors' shapes in one call). An in-place op's tensors must keep their storage until `unpack`
    (as with Horovod, whose ops also write to the addresses taken at submission): the copy back goes
    to the addresses listed in `pack`."""

    __slots__ = ("flat", "_rows", "_tensors", "_blocks")

    def __init__(self, tensors: list, blocks: tuple | None, out=None):
        self._tensors = tensors
        self._rows = None
        self._blocks = blocks
        if blocks is not None:
            n, dtype = sum(blocks[1]) // tensors[0].element_size(), tensors[0].dtype
            fits = out is not None and out.dtype is dtype and out.numel() == n
            self.flat = out if fits else torch.empty(n, dtype=dtype)
            if gather.gather(blocks, _bytes(self.flat)):
                return
            self._blocks = None
        with torch.no_grad():  # a copy for the engine: no graph (parameters may require grad)
            dim = tensors[0].dim()
            if dim and all(t.dim() == dim for t in tensors):  # (cat would skip a 1-D empty tensor among others)
                try:
                    self._rows = torch.cat(tensors)  # the usual case: biases, or layers of equal width
                except RuntimeError:  # different sizes after dim 0
                    pass
            self.flat = self._rows.view(-1) if self._rows is not None else _flatten(tensors)

    def views(self) -> list:
        """The reduced tensors as views of `flat`, shaped like the inputs (an out-of-place result)."""
        if self._rows is not None:
            return list(self._rows.split([t.shape[0] for t in self._tensors]))
        return list(_unflatten(self.flat, self._tensors))

    def unpack(self) -> list:
        """Copy `flat` back into the input tensors (an in-place result); returns them."""
        if self._blocks is not None and gather.scatter(_bytes(self.flat), self._blocks):
            return self._tensors
        with torch.no_grad():  # written as a result, not a differentiable op (as Horovod's in-place ops)
            torch._foreach_copy_(self._tensors, self.views())
        return self._tensors


def _bytes(t: torch.Tensor):
    """A contiguous tensor's memory as a NumPy uint8 array (any dtype, bfloat16 included)."""
    return t.view(torch.uint8).numpy() if t.dtype is not torch.bool else t.numpy().view("uint8")
