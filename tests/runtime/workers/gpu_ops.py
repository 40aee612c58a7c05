"""CUDA tensors through NCCL (or host staging with TRAINRUN_GPU_OPERATIONS=mpi); run by test_gpu.py.

Every op x dtype x in place/out of place x sync/async on this rank's GPU, against a float64 CPU
reference of every rank's data (a function of (seed, rank) only); grouped ops (one reduction);
gradients; and DistributedOptimizer training on the GPU against single-process training on the
concatenated batches. GPU_OPS_DEVICE=cpu runs the same cases on CPU tensors (to check the worker
itself on a machine without a GPU).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import trainrun.torch as hvd  # noqa: E402
from harness import case, main  # noqa: E402

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPES = FLOATS + (torch.uint8, torch.int8, torch.int32, torch.int64)


def dev():
    if os.environ.get("GPU_OPS_DEVICE") == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())


def data(rank, seed, shape, dtype, low=-3, high=4):
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    if dtype == torch.uint8:
        low = 0
    return torch.randint(low, high, shape, generator=g).to(dtype)


def everyone(seed, shape, dtype=torch.float64, low=-3, high=4):
    """Every rank's data (made as `dtype`, held as float64), stacked along a new first dimension."""
    return torch.stack([data(r, seed, shape, dtype, low, high).double() for r in range(hvd.size())])


def close(got, want, dtype, device=None):
    assert got.device == (device or dev()), f"result on {got.device}, not {device or dev()}"
    assert got.dtype == dtype, f"result is {got.dtype}, not {dtype}"
    tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
    if not dtype.is_floating_point:
        want = want.trunc() if want.is_floating_point() else want
    torch.testing.assert_close(got.cpu().double(), want.double(), rtol=tol, atol=tol, msg=lambda m: f"{dtype}: {m}")


@case
def path_in_use():
    """The path the test asked for is the one taken (the launcher sets "mpi" for --allow-gpu-sharing)."""
    from trainrun.runtime import lifecycle
    want = os.environ.get("EXPECT_GPU_OPERATIONS")
    if want:
        got = lifecycle.gpu_operations()
        assert got == want, f"GPU operations {got!r}, expected {want!r}"
    if dev().type == "cuda":
        torch.cuda.set_device(dev())


@case
def allreduce_every_dtype_and_op():
    n = hvd.size()
    for i, dtype in enumerate(DTYPES):
        ops = [hvd.Sum, hvd.Min, hvd.Max] + ([hvd.Average] if dtype.is_floating_point else [])
        for j, op in enumerate(ops):
            seed = 100 * i + j
            x = data(hvd.rank(), seed, (1000,), dtype).to(dev())
            ref = everyone(seed, (1000,), dtype)
            want = {hvd.Sum: ref.sum(0), hvd.Min: ref.min(0).values, hvd.Max: ref.max(0).values,
                    hvd.Average: ref.mean(0)}[op]
            close(hvd.allreduce(x, op=op, name=f"ar.{i}.{j}"), want, dtype)
            y = x.clone()
            assert hvd.allreduce_(y, op=op, name=f"ar_.{i}.{j}") is y
            close(y, want, dtype)
            close(hvd.synchronize(hvd.allreduce_async(x, op=op, name=f"ara.{i}.{j}")), want, dtype)
            z = x.clone()
            hvd.synchronize(hvd.allreduce_async_(z, op=op, name=f"ara_.{i}.{j}"))
            close(z, want, dtype)
        if dtype in (torch.float32, torch.float64, torch.int32):
            x = data(hvd.rank(), 900 + i, (77,), dtype, 1, 3).to(dev())
            close(hvd.allreduce(x, op=hvd.Product), everyone(900 + i, (77,), dtype, 1, 3).prod(0), dtype)
    assert n >= 1


@case
def pre_and_postscale():
    for i, dtype in enumerate((torch.float16, torch.float32, torch.float64)):
        x = data(hvd.rank(), 300 + i, (17, 3), dtype).to(dev())
        got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
        close(got, everyone(300 + i, (17, 3)).mul(0.5).sum(0).mul(3.0), dtype)
        got = hvd.allreduce(x, op=hvd.Average, postscale_factor=2.0)
        close(got, everyone(300 + i, (17, 3)).mean(0).mul(2.0), dtype)


@case
def async_many_and_grouped():
    """50 async ops in flight at once; a grouped allreduce is one reduction."""
    from trainrun.runtime import lifecycle
    hs = [hvd.allreduce_async_(data(hvd.rank(), 500 + i, (33 + i,), torch.float32).to(dev()), name=f"many.{i}",
                               op=hvd.Max) for i in range(50)]
    for i, h in enumerate(hs):
        close(hvd.synchronize(h), everyone(500 + i, (33 + i,)).max(0).values, torch.float32)
    tensors = [data(hvd.rank(), 600 + i, (i + 1, 5), torch.float32).to(dev()) for i in range(10)]
    before = lifecycle.engine().reductions
    outs = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    assert lifecycle.engine().reductions - before == 1, "a grouped allreduce took more than one reduction"
    for i, out in enumerate(outs):
        close(out, everyone(600 + i, (i + 1, 5)).sum(0), torch.float32)


@case
def allgather_broadcast_every_dtype():
    me, n = hvd.rank(), hvd.size()
    for i, dtype in enumerate(DTYPES):
        got = hvd.allgather(data(me, 700 + i, (me + 1, 3), dtype).to(dev()))  # ragged: rank r has r+1 rows
        want = torch.cat([data(r, 700 + i, (r + 1, 3), dtype).double() for r in range(n)])
        close(got, want, dtype)
        for root in range(n):
            t = data(me, 800 + i, (5, 2), dtype).to(dev())
            hvd.broadcast_(t, root_rank=root, name=f"bc_.{i}.{root}")
            close(t, data(root, 800 + i, (5, 2), dtype).double(), dtype)
            close(hvd.broadcast(data(me, 850 + i, (4,), dtype).to(dev()), root_rank=root, name=f"bc.{i}.{root}"),
                  data(root, 850 + i, (4,), dtype).double(), dtype)
    outs = hvd.grouped_allgather([torch.full((me + 1,), float(me), device=dev()), torch.full((2,), 1.0, device=dev())])
    close(outs[0], torch.cat([torch.full((r + 1,), float(r)) for r in range(n)]), torch.float32)
    close(outs[1], torch.ones(2 * n), torch.float32)


@case
def alltoall_every_dtype():
    me, n = hvd.rank(), hvd.size()
    # rank r sends (r + p) % 3 rows to peer p: some parts empty (when n >= 3), none the same size
    splits = [[(r + p) % 3 for p in range(n)] for r in range(n)]
    for i, dtype in enumerate(DTYPES):
        rows = sum(splits[me])
        x = (torch.arange(rows * 2).reshape(rows, 2) % 50 + 10 * me).to(dtype).to(dev())
        out, received = hvd.alltoall(x, splits=torch.tensor(splits[me], dtype=torch.int32))
        want = []
        for r in range(n):
            src = (torch.arange(sum(splits[r]) * 2).reshape(-1, 2) % 50 + 10 * r).double()
            start = sum(splits[r][:me])
            want.append(src[start:start + splits[r][me]])
        close(out, torch.cat(want), dtype)
        assert received.tolist() == [splits[r][me] for r in range(n)]
    out = hvd.alltoall(torch.arange(n, device=dev()) + 10 * me)  # even split, no splits returned
    close(out, torch.arange(n) * 10 + me, torch.int64)


@case
def reducescatter_every_float_dtype():
    me, n = hvd.rank(), hvd.size()
    for i, dtype in enumerate(FLOATS + (torch.int32,)):
        shape = (2 * n + 1, 3)  # uneven: the first rank gets one more row
        x = data(me, 1000 + i, shape, dtype).to(dev())
        ref = everyone(1000 + i, shape, dtype)
        rows = [(2 * n + 1) // n + (1 if r < (2 * n + 1) % n else 0) for r in range(n)]
        start = sum(rows[:me])
        close(hvd.reducescatter(x, op=hvd.Sum), ref.sum(0)[start:start + rows[me]], dtype)
        if dtype.is_floating_point:
            close(hvd.reducescatter(x, op=hvd.Average), ref.mean(0)[start:start + rows[me]], dtype)
    outs = hvd.grouped_reducescatter([torch.ones(n, 2, device=dev()), torch.ones(2 * n, device=dev())], op=hvd.Sum)
    close(outs[0], torch.full((1, 2), float(n)), torch.float32)
    close(outs[1], torch.full((2,), float(n)), torch.float32)


@case
def gradients_on_gpu():
    """Horovod's gradients: of allreduce(Sum) the summed output gradient, of allgather this rank's slice of
    the averaged output gradient; they stay on the GPU."""
    n, me = hvd.size(), hvd.rank()
    x = torch.full((4,), float(me + 1), device=dev(), requires_grad=True)
    (hvd.allreduce(x, op=hvd.Sum) * torch.arange(4, device=dev())).sum().backward()
    close(x.grad, torch.arange(4).double() * n, torch.float32)
    y = torch.ones(me + 1, 2, device=dev(), requires_grad=True)
    hvd.allgather(y).sum().backward()
    close(y.grad, torch.ones(me + 1, 2), torch.float32)


def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).double().to(dev())


def _batch(step, rank):
    g = torch.Generator().manual_seed(step * 10 + rank)
    return torch.randn(8, 16, generator=g, dtype=torch.float64).to(dev())


@case
def distributed_optimizer_equals_single_process():
    """Each rank trains on its batch; every rank also trains the reference on all ranks' batches (the
    mean of the per-rank losses: the gradient the averaged allreduce must give)."""
    model, ref = _mlp(), _mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), 0)
    for step in range(4):
        opt.zero_grad()
        ref_opt.zero_grad()
        model(_batch(step, hvd.rank())).pow(2).mean().backward()
        (sum(ref(_batch(step, r)).pow(2).mean() for r in range(hvd.size())) / hvd.size()).backward()
        opt.step()
        ref_opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert flat.is_cuda == (dev().type == "cuda")
    want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    torch.testing.assert_close(flat, want, rtol=1e-10, atol=1e-10)
    assert not torch.equal(flat, torch.cat([p.detach().reshape(-1) for p in _mlp().parameters()]))
    gathered = hvd.allgather_object(flat.cpu())
    assert all(torch.equal(flat.cpu(), other) for other in gathered)
    # the optimizer state of a GPU model broadcasts too (momentum buffers on the GPU)
    hvd.broadcast_optimizer_state(opt, root_rank=0)


if __name__ == "__main__":
    main(hvd)
