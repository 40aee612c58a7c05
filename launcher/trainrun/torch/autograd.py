"""The differentiable blocking ops of trainrun.torch, with Horovod's gradients. The engine travels
in ctx, so backward runs on the same process set as forward."""
from __future__ import annotations

import torch

from trainrun.runtime import api
from trainrun.runtime.ops import Average, Sum
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
    """Gradient (Horovod's convention): the gathered slices' gradients, times the set's size for
    Sum (1 for Average), times the pre- and postscale factors."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, eng):
        ctx.scale, ctx.eng = _reducescatter_scale(op, prescale_factor, postscale_factor, eng), eng
        return api.run(build.reducescatter(eng, tensor, name, op, prescale_factor, postscale_factor), eng)

    @staticmethod
    def backward(ctx, grad_output):
        grad = api.run(build.allgather(ctx.eng, grad_output.contiguous(), None), ctx.eng)
        return (grad * ctx.scale if ctx.scale != 1.0 else grad), None, None, None, None, None


def _reducescatter_scale(op, prescale_factor, postscale_factor, eng) -> float:
    return (eng.size if op == Sum else 1.0) * prescale_factor * postscale_factor


class HorovodGroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, eng, *tensors):
        ctx.scale, ctx.eng = _reducescatter_scale(op, prescale_factor, postscale_factor, eng), eng
        return tuple(api.run(build.grouped(eng, build.reducescatter, "grouped_reducescatter", tensors, name, op,
                                           prescale_factor, postscale_factor), eng))

    @staticmethod
    def backward(ctx, *grads):
        eng = ctx.eng
        gathered = api.run(build.grouped(eng, build.allgather, "grouped_allgather",
                                         [g.contiguous() for g in grads], None), eng)
        return (None, None, None, None, None, *[g * ctx.scale if ctx.scale != 1.0 else g for g in gathered])


class HorovodGroupedAllgather(torch.autograd.Function):
    """Gradient: as HorovodAllgather's, per tensor (one grouped allreduce, one allgather of the dims)."""

    @staticmethod
    def forward(ctx, name, eng, *tensors):
        ctx.dims, ctx.eng = [t.shape[0] for t in tensors], eng
        return tuple(api.run(build.grouped(eng, build.allgather, "grouped_allgather", tensors, name), eng))

    @staticmethod
    def backward(ctx, *grads):
        eng = ctx.eng
        reduced = api.run(build.grouped_allreduce(eng, [g.contiguous() for g in grads], None, Average, 1.0, 1.0,
                                                  False), eng)
        dims = api.run(build.allgather(eng, torch.tensor([ctx.dims], dtype=torch.int64), None), eng)
        offsets = dims[:eng.rank].sum(0).tolist() if eng.rank else [0] * len(ctx.dims)
        return (None, None, *[g.narrow(0, o, d) for g, o, d in zip(reduced, offsets, ctx.dims)])


class HorovodAlltoall(torch.autograd.Function):
    """Gradient: the reverse alltoall (each rank sends back the rows it received)."""

    @staticmethod
    def forward(ctx, tensor, splits, name, eng):
        ctx.eng = eng
        out, received = api.run(build.alltoall(eng, tensor, splits, name, both=True), eng)
        ctx.received = received
        if splits is None:
            return out
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad_output, *_):
        grad, _ = api.run(build.alltoall(ctx.eng, grad_output.contiguous(), ctx.received, None, both=True), ctx.eng)
        return grad, None, None, None
