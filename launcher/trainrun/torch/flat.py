"""A group of CPU tensors of one dtype as one flat tensor: how grouped allreduces travel.

A grouped allreduce of many small tensors is dominated by per-tensor Python, not by its data (160
gradients of 4 KiB: ~2 us of Python each against ~2 us of reduction). Here the whole group is copied
in with one torch call (`pack`), reduced as one tensor, and copied out or viewed with one more
(`unpack`, `views`), so the per-tensor Python left is a size list.

`pack` concatenates along dim 0 when every tensor has the same dimensions after it (then the
concatenation's memory is the tensors' data back to back, row-major), else flattens each first
(torch's flatten_dense_tensors: slower, any shapes). Inputs need not be contiguous.
"""
from __future__ import annotations

import torch

_flatten = torch._C._nn.flatten_dense_tensors
_unflatten = torch._C._nn.unflatten_dense_tensors


def packable(tensors: list) -> bool:
    """Non-empty, every tensor on the CPU, all of one dtype (the same on every rank of a correct program,
    so every rank takes the same path)."""
    if not tensors:
        return False
    dtype = tensors[0].dtype
    for t in tensors:
        if not t.is_cpu or t.dtype is not dtype:
            return False
    return True


class Packed:
    """The group's data back to back in `flat` (1-D, contiguous, a new tensor). `_rows`, when the
    tensors were concatenated along dim 0, is the concatenation `flat` views (it splits back into the
    tensors' shapes in one call)."""

    __slots__ = ("flat", "_rows", "_tensors")

    def __init__(self, tensors: list):
        self._tensors = tensors
        self._rows = None
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
        with torch.no_grad():  # written as a result, not a differentiable op (as Horovod's in-place ops)
            torch._foreach_copy_(self._tensors, self.views())
        return self._tensors
