"""hvd.SyncBatchNorm: batch normalization with the batch statistics of every rank (horovod.torch.SyncBatchNorm).

In training mode the mean and variance come from the whole global batch: one differentiable Sum
allreduce of the per-channel sums and counts, then one of the squared deviations from the global
mean (two passes: no cancellation in E[x^2] - E[x]^2). Gradients flow through both allreduces
(their gradient is the Sum allreduce of the gradient), so each rank's input gradient is that of the
loss summed over ranks, as with torch.nn.SyncBatchNorm. Running statistics are updated identically
on every rank (unbiased variance, as torch). In eval mode, or on one rank, it is plain batch norm.
"""
from __future__ import annotations

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from trainrun.runtime import lifecycle
from trainrun.runtime.ops import Sum
from trainrun.torch.autograd import HorovodAllreduce


class SyncBatchNorm(_BatchNorm):
    """Same arguments as torch.nn.BatchNorm*d; any input of shape (N, C, ...)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        eng = lifecycle.engine()
        if not self.training or eng.size == 1:
            return super().forward(input)
        c = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        shape = [1, c] + [1] * (input.dim() - 2)
        local = torch.cat([input.sum(dims), input.new_tensor([input.numel() // c])])
        total = HorovodAllreduce.apply(local, Sum, None, 1.0, 1.0, eng)
        count = total[c]
        mean = total[:c] / count
        centered = input - mean.view(shape)
        var = HorovodAllreduce.apply((centered * centered).sum(dims), Sum, None, 1.0, 1.0, eng) / count
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = self._momentum()
                n = float(count)
                self.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
                self.running_var.mul_(1 - m).add_(var.detach() * (n / max(n - 1, 1)), alpha=m)
        out = centered * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out

    def _momentum(self) -> float:
        if self.momentum is not None:
            return self.momentum
        return 1.0 / float(self.num_batches_tracked) if self.num_batches_tracked > 0 else 0.0
