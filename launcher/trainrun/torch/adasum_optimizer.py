"""DistributedOptimizer(op=Adasum): Horovod's delta optimizer (horovod.torch's _DistributedAdasumOptimizer).

Adasum combines what each rank's optimizer *did*, not the raw gradients: every rank applies its own
optimizer step to its own gradient, and the ranks then combine the parameter changes (deltas) with
op=Adasum (runtime/adasum.py) and all move by the combined delta. So an optimizer with state (Adam's
moments, momentum) keeps per-rank state, as in Horovod.

Per parameter, as soon as its gradient is final (a post-accumulate-grad hook, after
backward_passes_per_step passes):
    start <- p;  local optimizer step on p alone;  p <- p - start (the delta);  allreduce_async_(p, Adasum)
and `step()` waits for each: start += combined delta; p <- start. Parameters whose hook did not fire
take the same path in step(), so every rank reduces every parameter once per step.
A mixin body for a dynamic subclass of the user's optimizer class (torch/optimizer.py makes it), so
`super(self.__class__, self).step()` is that class's own step.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from trainrun.runtime import lifecycle
from trainrun.runtime.ops import Adasum
from trainrun.torch.mpi_ops import allreduce_async_
from trainrun.torch.passes import count_pass, refuse_zero_grad


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    def __init__(self, params, parameter_names: dict, compression, backward_passes_per_step=1):
        """`parameter_names`: parameter -> its (unique, checked by the caller) name on the wire."""
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._parameter_names = parameter_names
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step for p in parameter_names}
        self._handles: dict = {}
        self._hook_handles = []
        self._requires_update = set()
        self._starting_models = {p: torch.zeros_like(p, requires_grad=False) for p in parameter_names}
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    self._hook_handles.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _allreduce_delta_async(self, p):
        """Step the wrapped optimizer on `p` alone, turn p into its delta, start its Adasum allreduce."""
        start = self._starting_models[p]
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:  # the optimizer's step on p only (its state stays per parameter)
            group["params"] = [p] if any(p is q for q in group["params"]) else []
        try:
            with torch.no_grad():
                start.copy_(p)
            super(self.__class__, self).step()
            with torch.no_grad():
                p.sub_(start)
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        compressed, ctx = self._compression.compress(p.data)
        return allreduce_async_(compressed, name=self._parameter_names[p], op=Adasum), (compressed, ctx)

    def _make_hook(self, p):
        def hook(*_):
            handle = ctx = None
            if count_pass(self._allreduce_delay, p):
                handle, ctx = self._allreduce_delta_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        """Nothing to do before step(): the deltas are combined in step() (as in Horovod)."""

    @contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")
        yield  # (a generator, for contextmanager)

    def step(self, closure=None):
        """Combine every parameter's delta over the ranks (Adasum) and move each parameter by it."""
        loss = closure() if closure is not None else None
        for p in self._requires_update - set(self._handles):
            self._handles[p] = self._allreduce_delta_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:  # step() before backward_passes_per_step passes: reduce what there is
                handle, ctx = self._handles[p] = self._allreduce_delta_async(p)
        for p, (handle, (compressed, cctx)) in self._handles.items():
            lifecycle.synchronize(handle)
            delta = self._compression.decompress(compressed, cctx)
            start = self._starting_models[p]
            with torch.no_grad():
                start.add_(delta.to(start.dtype))
                p.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    def zero_grad(self, *args, **kwargs):
        refuse_zero_grad(self._handles)
        return super(self.__class__, self).zero_grad(*args, **kwargs)
