"""Rank-side checks of trainrun.torch's ops (run by tests/runtime/test_torch.py)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import trainrun.torch as hvd  # noqa: E402
from harness import case, main  # noqa: E402

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64]
TOL = {torch.float16: 1e-3, torch.bfloat16: 1e-2}


def data(rank, seed, shape, dtype):
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    return torch.randint(-3, 4, shape, generator=g).to(dtype)


def ranks_data(seed, shape, dtype=torch.float64):
    return torch.stack([data(r, seed, shape, dtype) for r in range(hvd.size())])


def close(got, want, dtype):
    tol = TOL.get(dtype, 1e-6)
    torch.testing.assert_close(got.to(torch.float64), want.to(torch.float64), rtol=tol, atol=tol)


@case
def allreduce_dtypes_ops():
    seed = 0
    for dtype in DTYPES:
        for shape in ((0,), (1,), (9,), (4, 257)):
            seed += 1
            mine = data(hvd.rank(), seed, shape, dtype)
            stack = ranks_data(seed, shape)
            for op, want in ((hvd.Sum, stack.sum(0)), (hvd.Min, stack.min(0).values if stack.numel() else stack.sum(0)),
                             (hvd.Max, stack.max(0).values if stack.numel() else stack.sum(0)),
                             (hvd.Product, stack.prod(0))):
                got = hvd.allreduce(mine, op=op)
                assert got.dtype == dtype and got.shape == mine.shape
                close(got, want, dtype)
            if dtype.is_floating_point:
                close(hvd.allreduce(mine), stack.mean(0), dtype)
                close(hvd.allreduce(mine, average=False), stack.sum(0), dtype)


@case
def in_place_and_non_contiguous():
    for dtype in (torch.float32, torch.bfloat16):
        base = data(hvd.rank(), 50, (6, 8), dtype)
        other = base[:, 1::2].clone()
        out = hvd.allreduce_(base[:, ::2], op=hvd.Sum)
        close(base[:, ::2], ranks_data(50, (6, 8)).sum(0)[:, ::2], dtype)
        assert torch.equal(base[:, 1::2], other)
        close(out, base[:, ::2], dtype)
    t = data(hvd.rank(), 51, (5, 3), torch.float32)
    assert hvd.allreduce_(t, op=hvd.Max) is t
    close(t, ranks_data(51, (5, 3)).max(0).values, torch.float32)
    t = data(hvd.rank(), 52, (3, 4), torch.float64).t()
    close(hvd.allreduce(t, op=hvd.Sum), ranks_data(52, (3, 4)).sum(0).t(), torch.float64)
    # contiguous views at an offset into a larger storage (the blocking path reduces at the tensor's
    # own address): only the view's elements change, in place; out of place, none do
    for dtype in (torch.float32, torch.int64, torch.float16):
        big = data(hvd.rank(), 53, (4, 6), dtype)
        before = big.clone()
        rows = big[1:3]
        assert rows.is_contiguous() and rows.storage_offset() == 6
        got = hvd.allreduce(rows, op=hvd.Sum)
        assert torch.equal(big, before), f"{dtype}: out of place wrote its input"
        close(got, ranks_data(53, (4, 6)).sum(0)[1:3], dtype)
        assert hvd.allreduce_(rows, op=hvd.Sum) is rows
        close(big[1:3], ranks_data(53, (4, 6)).sum(0)[1:3], dtype)
        assert torch.equal(big[0], before[0]) and torch.equal(big[3:], before[3:]), f"{dtype}: wrote outside the view"
    empty = torch.empty(0, 3)
    assert hvd.allreduce_(empty) is empty and hvd.allreduce(empty).shape == (0, 3)


@case
def async_grouped_and_scaled():
    hs = [hvd.allreduce_async(data(hvd.rank(), 60 + i, (11,), torch.float32), name=f"t.async.{i}", op=hvd.Sum)
          for i in range(10)]
    for i, h in enumerate(hs):
        close(hvd.synchronize(h), ranks_data(60 + i, (11,)).sum(0), torch.float32)
    ts = [data(hvd.rank(), 70 + i, (i + 2,), torch.float32) for i in range(5)]
    for i, out in enumerate(hvd.grouped_allreduce(ts, op=hvd.Sum)):
        close(out, ranks_data(70 + i, (i + 2,)).sum(0), torch.float32)
    h = hvd.grouped_allreduce_async_(ts, op=hvd.Max)
    hvd.synchronize(h)
    for i, t in enumerate(ts):
        close(t, ranks_data(70 + i, (i + 2,)).max(0).values, torch.float32)
    x = data(hvd.rank(), 80, (7,), torch.float32)
    close(hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0), ranks_data(80, (7,)).sum(0) * 1.5, torch.float32)
    close(hvd.allreduce(x, compression=hvd.Compression.fp16), ranks_data(80, (7,)).mean(0), torch.float16)


@case
def grouped_allreduce_layouts():
    """Groups travel as one flat copy (trainrun/torch/flat.py): concatenated along dim 0 when the
    dims after it agree, else flattened one by one. Each layout, in place and out of place, sync and
    async, against the float64 reference: equal widths (cat), mixed dims, a 0-d tensor, an empty 1-D
    tensor among 2-D ones (which cat would skip), non-contiguous inputs, parameters requiring grad."""
    layouts = {"equal widths": [(3, 4), (5, 4), (1, 4)], "mixed dims": [(2,), (3, 2), (1,)],
               "0-d": [(), (3,)], "empty 1-D among 2-D": [(2, 3), (0,), (4, 3)], "one": [(6,)]}
    seed = 300
    for label, shapes in layouts.items():
        for in_place in (False, True):
            for asynchronous in (False, True):
                seed += 1
                ts = [data(hvd.rank(), seed + i, s, torch.float32) for i, s in enumerate(shapes)]
                wants = [ranks_data(seed + i, s).sum(0) for i, s in enumerate(shapes)]
                if in_place:
                    h = hvd.grouped_allreduce_async_(ts, op=hvd.Sum) if asynchronous else None
                    got = hvd.synchronize(h) if asynchronous else hvd.grouped_allreduce_(ts, op=hvd.Sum)
                    assert all(g is t for g, t in zip(got, ts)), f"{label}: in place must return the inputs"
                else:
                    h = hvd.grouped_allreduce_async(ts, op=hvd.Sum) if asynchronous else None
                    got = hvd.synchronize(h) if asynchronous else hvd.grouped_allreduce(ts, op=hvd.Sum)
                    for t, i in zip(ts, range(len(shapes))):  # inputs untouched
                        close(t, data(hvd.rank(), seed + i, shapes[i], torch.float32), torch.float32)
                for g, w, s in zip(got, wants, shapes):
                    assert tuple(g.shape) == s, f"{label}: shape {tuple(g.shape)} != {s}"
                    close(g, w, torch.float32)
    # non-contiguous inputs, reduced in place: written back through their strides
    seed += 1
    base = [data(hvd.rank(), seed + i, (4, 3), torch.float64) for i in range(3)]
    ts = [b.t() for b in base]
    hvd.grouped_allreduce_(ts, op=hvd.Sum)
    for i, b in enumerate(base):
        close(b, ranks_data(seed + i, (4, 3)).sum(0), torch.float64)
    # parameters (leaves requiring grad): reduced in place without autograd, grad mode on
    params = [torch.nn.Parameter(torch.full((3,), float(hvd.rank() + 1))) for _ in range(2)]
    hvd.grouped_allreduce_(params, op=hvd.Sum)
    want = float(sum(range(1, hvd.size() + 1)))
    assert all(p.requires_grad and torch.equal(p.detach(), torch.full((3,), want)) for p in params)


@case
def grouped_in_place_copied_by_mpi():
    """An in-place group of contiguous CPU tensors is copied in and out by MPI's datatype engine
    (runtime/gather.py): every dtype with empty and 0-d tensors among them, the same tensor twice,
    more distinct groups than the datatype cache keeps (evicted datatypes are freed; their groups
    still reduce right when they come back), and groups from two threads at once."""
    import threading

    from trainrun.runtime import gather
    calls = []
    real = gather.gather
    gather.gather = lambda blocks, dst: calls.append(len(blocks[0])) or real(blocks, dst)
    try:
        seed = 400
        shapes = [(3,), (0,), (), (2, 5), (257,), (4, 1, 2)]
        for dtype in DTYPES:
            seed += 1
            ts = [data(hvd.rank(), seed + i, s, dtype) for i, s in enumerate(shapes)]
            assert hvd.grouped_allreduce_(ts, op=hvd.Sum) == ts
            for i, (t, s) in enumerate(zip(ts, shapes)):
                assert t.dtype == dtype and tuple(t.shape) == s
                close(t, ranks_data(seed + i, s).sum(0), dtype)
        assert calls == [len(shapes)] * len(DTYPES), f"the MPI copy was not taken: {calls}"
        t = torch.full((5,), float(hvd.rank() + 1))  # twice in one group: both entries carry the same sum
        hvd.grouped_allreduce_([t, t], op=hvd.Sum)
        assert torch.equal(t, torch.full((5,), float(sum(range(1, hvd.size() + 1))))), t
        groups = [[torch.full((i % 7 + 1,), float(hvd.rank() + i)) for _ in range(3)] for i in range(gather._CACHED + 8)]
        for rnd in range(2):
            for i, g in enumerate(groups):
                for t in g:
                    t.fill_(float(hvd.rank() + i))
                hvd.grouped_allreduce_(g, op=hvd.Sum, name=f"cache.{i}")
                want = float(sum(r + i for r in range(hvd.size())))
                assert all(torch.equal(t, torch.full_like(t, want)) for t in g), (rnd, i, g)
        assert len(gather._layouts) == gather._CACHED
        failures = []

        def worker(k):
            try:
                for step in range(20):
                    g = [torch.full((k + 2,), float(hvd.rank() * 100 + step)) for _ in range(4)]
                    hvd.grouped_allreduce_(g, op=hvd.Sum, name=f"thread{k}.{step}")
                    want = float(sum(r * 100 + step for r in range(hvd.size())))
                    if not all(torch.equal(t, torch.full_like(t, want)) for t in g):
                        failures.append((k, step, g))
            except Exception as e:  # noqa: BLE001 (reported below)
                failures.append((k, repr(e)))
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not failures, failures
    finally:
        gather.gather = real


@case
def gather_broadcast_alltoall_reducescatter():
    me, n = hvd.rank(), hvd.size()
    for dtype in DTYPES:
        got = hvd.allgather(data(me, 90, (me + 1, 2), dtype))
        want = torch.cat([data(r, 90, (r + 1, 2), dtype) for r in range(n)])
        assert got.dtype == dtype and torch.equal(got, want)
        got = hvd.broadcast(data(me, 91, (3,), dtype), root_rank=n - 1)
        assert torch.equal(got, data(n - 1, 91, (3,), dtype))
        t = data(me, 92, (3,), dtype)
        hvd.broadcast_(t, 0)
        assert torch.equal(t, data(0, 92, (3,), dtype))
    out, received = hvd.alltoall(torch.arange(n) + 10 * me, splits=[1] * n)
    assert torch.equal(out, torch.arange(n) * 10 + me) and received.tolist() == [1] * n
    assert torch.equal(hvd.alltoall(torch.arange(n) + 10 * me), torch.arange(n) * 10 + me)
    got = hvd.reducescatter(data(me, 93, (2 * n, 3), torch.float32), op=hvd.Sum)
    close(got, ranks_data(93, (2 * n, 3)).sum(0)[2 * me:2 * me + 2], torch.float32)


@case
def autograd():
    me, n = hvd.rank(), hvd.size()
    x = torch.ones(3, requires_grad=True)
    hvd.allreduce(x * (me + 1), op=hvd.Sum).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), float(n * (me + 1))))  # grad allreduced (Sum) too
    x = torch.ones(me + 1, 2, requires_grad=True)
    g = hvd.allgather(x)
    (g * torch.arange(g.shape[0]).unsqueeze(1)).sum().backward()
    offset = sum(r + 1 for r in range(me))
    assert torch.equal(x.grad, torch.arange(offset, offset + me + 1).unsqueeze(1).expand(me + 1, 2).float())
    x = torch.ones(4, requires_grad=True)
    (hvd.broadcast(x, root_rank=0) * 2).sum().backward()
    assert torch.equal(x.grad, torch.full((4,), 2.0 if me == 0 else 0.0))
    x = torch.ones(2 * n, requires_grad=True)
    hvd.reducescatter(x, op=hvd.Sum).sum().backward()
    assert torch.equal(x.grad, torch.full((2 * n,), float(n)))  # Horovod: Sum scales by size
    ys = hvd.grouped_allreduce([torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)], op=hvd.Sum)
    assert all(y.requires_grad for y in ys)


@case
def objects():
    assert hvd.broadcast_object({"r": hvd.rank()}, root_rank=1) == {"r": 1}
    assert hvd.allgather_object(hvd.rank() * 2) == [2 * r for r in range(hvd.size())]
    assert hvd.join() in range(hvd.size())


if __name__ == "__main__":
    main(hvd)
