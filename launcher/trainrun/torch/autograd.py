"""The differentiable blocking ops of trainrun.torch, with Horovod's gradients. The engine travels
in ctx, so backward runs on the same process set as forward."""
from __future__ import annotations

import torch

from trainrun.runtime import api
from trainrun.runtime.ops import Average
from trainrun.torch import builders as build


class HorovodAllreduce(torch.autograd.Function):
    """Gradient of an allreduce is the same allreduce of the gradient."""

    @staticmethod
    def forward(ctx, tensor, op, name, prescale_factor, postscale_factor, eng):
        ctx.op, ctx.prescale_factor, ctx.postscale_factor, ctx.eng = op, prescale_factor, postscale_factor, eng
        return api.run(build.allreduce(eng, tensor, name, op, prescale_factor, postscale_factor, False), eng)

    @staticmethod
    def backward(ctx, grad_output):
        eng = ctx.eng
        grad = api.run(build.allreduce(eng, grad_output.contiguous(), None, ctx.op, ctx.prescale_factor,
                                  ctx.postscale_factor, False), eng)
        return grad, None, None, None, None, None


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, name, prescale_factor, postscale_factor, eng, *tensors):
        ctx.op, ctx.prescale_factor, ctx.postscale_factor, ctx.eng = op, prescale_factor, postscale_factor, eng
        return tuple(api.run(build.grouped_allreduce(eng, tensors, name, op, prescale_factor, postscale_factor, False),
                             eng))

    @staticmethod
    def backward(ctx, *grads):
        eng = ctx.eng
        reduced = api.run(build.grouped_allreduce(eng, [g.contiguous() for g in grads], None, ctx.op,
                                             ctx.prescale_factor, ctx.postscale_factor, False), eng)
        return (None, None, None, None, None, *reduced)


class HorovodAllgather(torch.autograd.Function):
    """Gradient: average the gradient over ranks, keep this rank's rows."""

    @staticmethod
    def forward(ctx, tensor, name, eng):
        ctx.dim, ctx.eng = tensor.shape[0], eng
        return api.run(build.allgather(eng, tensor, name), eng)

    @staticmethod
    def backward(ctx, grad_output):
        eng = ctx.eng
        grad = api.run(build.allreduce(eng, grad_output.contiguous(), None, Average, 1.0, 1.0, False), eng)
        dims = api.run(build.allgather(eng, torch.tensor([ctx.dim], dtype=torch.int64), None), eng)
        offset = int(dims[:eng.rank].sum())
        return grad.narrow(0, offset, ctx.dim), None, None


class HorovodBroadcast(torch.autograd.Function):
    """Gradient: the average gradient on the root, zero elsewhere."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, eng):
        ctx.root, ctx.eng = api.root_in(eng, root_rank), eng
        return api.run(build.broadcast(eng, tensor, root_rank, name, False), eng)

    @staticmethod
    def backward(ctx, grad_output):
        eng = ctx.eng
        grad = api.run(build.allreduce(eng, grad_output.contiguous(), None, Average, 1.0, 1.0, False), eng)
        if eng.rank != ctx.root:
            grad = grad * 0
        return grad, None, None, None


class HorovodReducescatter(torch.autograd.Function):
    """Gradient: gather the slices' gradients (divided by size for Average)."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, eng):
        ctx.op, ctx.eng = op, eng
        return api.run(build.reducescatter(eng, tensor, name, op, prescale_factor, postscale_factor), eng)

    @staticmethod
    def backward(ctx, grad_output):
        eng = ctx.eng
        grad = api.run(build.allgather(eng, grad_output.contiguous(), None), eng)
        if ctx.op == Average:
            grad = grad / eng.size
        return grad, None, None, None, None, None
