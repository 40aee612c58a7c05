"""Collectives on Keras values (tensors, variables, NumPy arrays) with Horovod's Keras signatures:
each returns a Keras (torch) tensor; `broadcast_variables` assigns in place."""
from __future__ import annotations

import keras
import torch

from trainrun.torch import mpi_ops


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
