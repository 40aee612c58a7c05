"""Model/optimizer state helpers (horovod.torch.functions): make every rank start from root's state."""
from __future__ import annotations

import io

import torch

from trainrun.runtime import api, lifecycle
from trainrun.torch.mpi_ops import broadcast_async_, synchronize


def broadcast_parameters(params, root_rank, prefix=None) -> None:
    """Overwrite, in place, every rank's parameters/buffers with root_rank's.

    `params` is a state_dict (or any mapping name -> tensor), or a sequence of (name, tensor) pairs
    such as `model.named_parameters()`, or of bare tensors. Broadcasts are named after the keys (sorted
    for mappings), so every rank must pass the same structure. Returns when all are done.
    """
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    handles = []
    for i, (name, p) in enumerate(params):
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise ValueError(f"broadcast_parameters: {name or i} is a {type(p).__name__}, not a tensor")
        label = f"{prefix or ''}{name if name is not None else f'param.{i}'}"
        handles.append(broadcast_async_(p.data if p.requires_grad else p, root_rank, name=f"broadcast.{label}"))
    for h in handles:
        synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank, prefix="Parameter.", model=None) -> None:
    """Replace every rank's optimizer state and hyperparameters (param_groups) with root_rank's.

    Works whether or not the optimizer has taken a step on any rank (its state_dict travels whole,
    as a torch.save blob). The optimizer must have the same parameter layout on every rank.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state:
        # as Horovod leaves a fresh optimizer's parameters (it steps once on zero gradients to create the
        # state; trainrun sends the state whole, without that step): zero gradients, sparse for SparseAdam
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p.data)
                    if isinstance(optimizer, torch.optim.SparseAdam):
                        p.grad = p.grad.to_sparse()
    blob = None
    if lifecycle.rank() == root_rank:
        buf = io.BytesIO()
        torch.save(optimizer.state_dict(), buf)
        blob = buf.getvalue()
    blob = api.broadcast_object(blob, root_rank, name=f"{prefix}optimizer_state")
    if lifecycle.rank() != root_rank:
        optimizer.load_state_dict(torch.load(io.BytesIO(blob), weights_only=False))


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """root_rank's `obj` (any picklable object) on every rank (of `process_set`)."""
    return api.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, name=None, process_set=None) -> list:
    """Every rank's `obj`, in rank order (of `process_set`)."""
    return api.allgather_object(obj, name, process_set)
