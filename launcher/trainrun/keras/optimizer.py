"""DistributedOptimizer for Keras 3 (torch backend), as horovod.keras.DistributedOptimizer.

The wrapped optimizer is a subclass of the original's class made on the fly (as Horovod does), built
from its config. Its `apply(grads, variables)` -- what `fit` and `apply_gradients` call -- first
averages (or sums: `op`) the gradients over ranks in one grouped allreduce, named after the
optimizer and the variables, so its signature is cached from the second step on. With
`backward_passes_per_step=k` the gradients of k calls accumulate locally and only every k-th call
reduces and applies them (averaged over the k passes if `average_aggregated_gradients`); the calls
in between apply nothing, so the optimizer's `iterations` counts real updates.
"""
from __future__ import annotations

from trainrun.runtime import state
from trainrun.runtime.ops import Adasum, Average
from trainrun.torch import mpi_ops
from trainrun.torch.compression import Compression


class _Distributed:
    """Mixed in before the user's optimizer class."""

    def apply(self, grads, trainable_variables=None):
        s = self._trainrun
        grads = list(grads)
        if s.passes > 1:
            if s.accumulated is None:
                s.accumulated = [None if g is None else g.detach().clone() for g in grads]
            else:
                for acc, g in zip(s.accumulated, grads):
                    if acc is not None and g is not None:
                        acc.add_(g)
            s.count += 1
            if s.count < s.passes:
                return None
            grads, s.accumulated, s.count = s.accumulated, None, 0
            if s.average_aggregated:
                grads = [None if g is None else g / s.passes for g in grads]
        return super().apply(self._trainrun_reduce(grads, trainable_variables), trainable_variables)

    def _trainrun_reduce(self, grads, variables):
        s = self._trainrun
        present = [i for i, g in enumerate(grads) if g is not None]
        if not present or state.engine(s.process_set).size == 1:
            return grads
        pairs = [s.compression.compress(grads[i].detach().contiguous()) for i in present]
        if s.name is None:
            paths = variables if variables is not None else [None] * len(grads)
            s.name = "keras.grads." + self.name + "." + ".".join(
                getattr(paths[i], "path", str(i)) for i in present)
        pre, post = (1.0 / s.predivide, s.predivide) if s.op == Average else (1.0, 1.0)
        reduced = mpi_ops.grouped_allreduce([t for t, _ in pairs], name=s.name, op=s.op,
                                            prescale_factor=pre, postscale_factor=post, process_set=s.process_set)
        out = list(grads)
        for i, r, (_, ctx) in zip(present, reduced, pairs):
            out[i] = s.compression.decompress(r, ctx)
        return out


class _Settings:
    def __init__(self, compression, passes, average_aggregated, op, predivide, process_set):
        self.compression, self.passes, self.average_aggregated = compression, passes, average_aggregated
        self.process_set = process_set
        self.op, self.predivide = op, predivide
        self.name = None          # the grouped allreduce's name, fixed on the first step
        self.accumulated = None   # gradients summed over the passes so far
        self.count = 0


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0,
                         groups=None, process_set=None):
    """A copy of `optimizer` (a keras.optimizers.Optimizer) whose updates use gradients reduced over
    all ranks. `device_*`, `sparse_as_dense` are accepted and ignored (torch tensors, dense);
    `num_groups`/`groups` are accepted: all gradients always travel as one group."""
    import keras

    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"DistributedOptimizer needs a keras.optimizers.Optimizer, got {type(optimizer).__name__}")
    if op == Adasum:
        raise ValueError("op=Adasum is not supported by trainrun; use Average or Sum")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be a positive integer, got {backward_passes_per_step!r}")
    cls = type(optimizer.__class__.__name__, (_Distributed, optimizer.__class__), {})
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    dist = cls.from_config(config)
    dist._trainrun = _Settings(compression, backward_passes_per_step, average_aggregated_gradients, op,
                               float(gradient_predivide_factor), process_set)
    return dist


__all__ = ["DistributedOptimizer"]
