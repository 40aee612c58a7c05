"""CUDA tensors through NCCL (or host staging with TRAINRUN_GPU_OPERATIONS=mpi); run by test_gpu.py."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import trainrun.torch as hvd  # noqa: E402
from harness import case, main  # noqa: E402


def dev():
    return torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())


def data(rank, seed, shape, dtype):
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    return torch.randint(-3, 4, shape, generator=g).to(dtype)


def stack(seed, shape):
    return torch.stack([data(r, seed, shape, torch.float64) for r in range(hvd.size())])


@case
def allreduce_on_gpu():
    torch.cuda.set_device(dev())
    for i, dtype in enumerate((torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64)):
        x = data(hvd.rank(), i, (1000,), dtype).to(dev())
        got = hvd.allreduce(x, op=hvd.Sum)
        assert got.device == x.device and got.dtype == dtype
        torch.testing.assert_close(got.cpu().double(), stack(i, (1000,)).sum(0))
        if dtype.is_floating_point:
            torch.testing.assert_close(hvd.allreduce(x).cpu().double(), stack(i, (1000,)).mean(0), rtol=1e-2, atol=1e-2)
    hs = [hvd.allreduce_async_(data(hvd.rank(), 50 + i, (33,), torch.float32).to(dev()), name=f"gpu.{i}", op=hvd.Max)
          for i in range(50)]
    for i, h in enumerate(hs):
        torch.testing.assert_close(hvd.synchronize(h).cpu().double(), stack(50 + i, (33,)).max(0).values)


@case
def gather_broadcast_alltoall_reducescatter_on_gpu():
    me, n = hvd.rank(), hvd.size()
    got = hvd.allgather(torch.full((me + 1, 2), float(me), device=dev()))
    assert got.device.type == "cuda"
    assert torch.equal(got.cpu(), torch.cat([torch.full((r + 1, 2), float(r)) for r in range(n)]))
    t = torch.full((3,), float(me), device=dev())
    hvd.broadcast_(t, root_rank=n - 1)
    assert torch.equal(t.cpu(), torch.full((3,), float(n - 1)))
    out, received = hvd.alltoall(torch.arange(n, device=dev()) + 10 * me, splits=[1] * n)
    assert torch.equal(out.cpu(), torch.arange(n) * 10 + me) and received.tolist() == [1] * n
    got = hvd.reducescatter(torch.ones(2 * n + 1, 3, device=dev()), op=hvd.Sum)
    assert got.shape[0] == (3 if me == 0 else 2) and torch.equal(got.cpu(), torch.full(got.shape, float(n)))


@case
def distributed_optimizer_on_gpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(dev())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), 0)
    for step in range(3):
        opt.zero_grad()
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step * 10 + hvd.rank())).to(dev())
        model(x).pow(2).mean().backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    assert all(torch.equal(flat, other) for other in hvd.allgather_object(flat))


if __name__ == "__main__":
    main(hvd)
