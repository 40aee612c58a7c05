"""backward_passes_per_step bookkeeping shared by the DistributedOptimizers (optimizer.py, adasum_optimizer.py)."""
from __future__ import annotations


def count_pass(handles: dict, delay: dict, p) -> bool:
    """One backward pass of parameter p (its gradient hook): True when it was the last of
    backward_passes_per_step (`delay[p]` counts down), AssertionError (Horovod's) when passes exceed it
    before step()."""
    if p in handles and handles[p][0] is not None and delay[p] <= 0:
        raise AssertionError("Gradients were computed more than backward_passes_per_step times before call "
                             "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
    assert delay[p] > 0
    delay[p] -= 1
    return delay[p] == 0
