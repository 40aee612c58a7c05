"""Collectives on Keras values for Keras 3's torch backend (variables are torch tensors there)."""
from __future__ import annotations

import keras
import torch

from trainrun.torch import Compression, mpi_ops

__all__ = ["Compression", "allgather", "allreduce", "broadcast", "broadcast_variables", "clone", "reducescatter",
           "reduce_gradients"]
accumulate_in_graph = None  # torch runs the train step eagerly: passes accumulate Python-side (optimizer.py)


def _tensor(value) -> torch.Tensor:
    if isinstance(value, keras.Variable):
        value = value.value
    return keras.ops.convert_to_tensor(value).detach()


def allreduce(value, name=None, average=None, op=None, prescale_factor=1.0, postscale_factor=1.0):
    """`value` reduced over ranks (default: averaged)."""
    return mpi_ops.allreduce(_tensor(value), average=average, name=name, op=op,
                             prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def allgather(value, name=None):
    """Every rank's `value` concatenated along the first dimension (which may differ per rank)."""
    return mpi_ops.allgather(_tensor(value), name=name)


def broadcast(value, root_rank, name=None):
    """`root_rank`'s `value` on every rank."""
    return mpi_ops.broadcast(_tensor(value), root_rank, name=name)


def reducescatter(value, name=None, op=None):
    return mpi_ops.reducescatter(_tensor(value), name=name, op=op)


def broadcast_variables(variables, root_rank: int, prefix: str = "broadcast_variables") -> None:
    """Assign `root_rank`'s values to `variables` (Keras variables) on every rank, in place. Every
    rank must pass the same variables (matched by their paths)."""
    handles = []
    for v in variables:
        value = v.value
        data = value.data if isinstance(value, torch.nn.Parameter) else value
        handles.append(mpi_ops.broadcast_async_(data, root_rank, name=f"{prefix}.{v.path}"))
    for h in handles:
        mpi_ops.synchronize(h)


def clone(g):
    return g.detach().clone()


def reduce_gradients(grads, variables, *, name, op, pre, post, compression, sparse_as_dense, process_set) -> list:
    """The non-None `grads` reduced in one grouped allreduce (others stay None)."""
    present = [i for i, g in enumerate(grads) if g is not None]
    pairs = [compression.compress(grads[i].detach().contiguous()) for i in present]
    reduced = mpi_ops.grouped_allreduce([t for t, _ in pairs], name=name, op=op, prescale_factor=pre,
                                        postscale_factor=post, process_set=process_set)
    out = list(grads)
    for i, r, (_, ctx) in zip(present, reduced, pairs):
        out[i] = compression.decompress(r, ctx)
    return out
