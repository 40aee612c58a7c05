"""Gradient-hook bookkeeping shared by the DistributedOptimizers (optimizer.py, adasum_optimizer.py):
backward_passes_per_step, and Horovod's rule against zero_grad() while reductions are outstanding."""
from __future__ import annotations


def count_pass(delay: dict, p) -> bool:
    """One backward pass of parameter p (its gradient hook): True when it was the last of
    backward_passes_per_step (`delay[p]` counts down; step() or synchronize() resets it), Horovod's
    AssertionError when passes exceed it before then."""
    if delay[p] <= 0:
        raise AssertionError("Gradients were computed more than backward_passes_per_step times before call "
                             "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
    delay[p] -= 1
    return delay[p] == 0


def refuse_zero_grad(handles: dict) -> None:
    """Horovod's AssertionError for zero_grad() between backward() and step()/synchronize(): the
    gradients it would clear are still being reduced."""
    if handles:
        raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                             "optimizer.step() or optimizer.synchronize(). This is prohibited as it "
                             "can cause a race condition.")
