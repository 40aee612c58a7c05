"""The torch conformance matrix (imported by workers/torch_api.py, so one launch per world size runs
it): every op x dtype x in-place/out-of-place x sync/async x process set (the global set, and one of
every rank but rank 0) against float64 references built from every rank's reproducible data; and
each differentiable op's gradient against its closed form (Horovod's conventions).

Each case collects every failing combination and reports them together."""
import torch
import trainrun.torch as hvd
from harness import case

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-6, torch.float64: 1e-12}
_sets = {}


def process_sets():
    """(label, process set, its ranks): the global set, and 'rest' = every rank but 0 (made once)."""
    if "rest" not in _sets:
        _sets["rest"] = hvd.add_process_set(list(range(1, hvd.size())))
    return [("global", hvd.global_process_set, list(range(hvd.size()))), ("rest", _sets["rest"], _sets["rest"].ranks)]


def data(rank, seed, shape, dtype):
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    low = 0 if dtype == torch.uint8 else -3
    return torch.randint(low, 4, shape, generator=g).to(dtype)


def ref(rank, seed, shape, dtype):
    """data(...) of `dtype`, in float64 (the reference's input)."""
    return data(rank, seed, shape, dtype).to(torch.float64)


def close(got, want, dtype, label, failures):
    try:
        assert got.dtype == dtype, f"dtype {got.dtype}"
        assert tuple(got.shape) == tuple(want.shape), f"shape {tuple(got.shape)} != {tuple(want.shape)}"
        tol = TOL.get(dtype, 0.0)
        torch.testing.assert_close(got.to(torch.float64), want.to(torch.float64), rtol=tol, atol=tol)
    except AssertionError as e:
        failures.append(f"{label}: {str(e).splitlines()[0]}")


def run(sync, start, *args, **kwargs):
    """The op through its blocking form, or its _async form + synchronize."""
    return sync(*args, **kwargs) if start is None else hvd.synchronize(start(*args, **kwargs))


def report(failures):
    assert not failures, f"{len(failures)} failing combinations:\n" + "\n".join(failures[:25])


REDUCE = {hvd.Sum: lambda s: s.sum(0), hvd.Min: lambda s: s.min(0).values, hvd.Max: lambda s: s.max(0).values,
          hvd.Product: lambda s: s.prod(0), hvd.Average: lambda s: s.mean(0)}


@case
def matrix_allreduce():
    me, failures, seed = hvd.rank(), [], 0
    for label, ps, ranks in process_sets():
        if me not in ranks:
            continue
        for dtype in DTYPES:
            for op, reduce in REDUCE.items():
                if op == hvd.Average and dtype not in FLOATS:
                    continue  # (integer averages truncate, as Horovod's)
                seed += 1
                want = reduce(torch.stack([ref(r, seed, (3, 5), dtype) for r in ranks])).to(dtype)
                for in_place in (False, True):
                    for asynchronous in (False, True):
                        t = data(me, seed, (3, 5), dtype)
                        tag = f"allreduce {label} {dtype} op={op} in_place={in_place} async={asynchronous}"
                        if in_place:
                            got = run(hvd.allreduce_, hvd.allreduce_async_ if asynchronous else None, t, op=op,
                                      process_set=ps)
                            close(t, want, dtype, tag + " (tensor)", failures)
                        else:
                            got = run(hvd.allreduce, hvd.allreduce_async if asynchronous else None, t, op=op,
                                      process_set=ps)
                            close(t, data(me, seed, (3, 5), dtype), dtype, tag + " (input untouched)", failures)
                        close(got, want, dtype, tag, failures)
    report(failures)


@case
def matrix_grouped_allreduce_and_scales():
    me, failures, seed = hvd.rank(), [], 100
    for label, ps, ranks in process_sets():
        if me not in ranks:
            continue
        for dtype in DTYPES:
            seed += 1
            shapes = [(2,), (3, 2), (1,)]
            wants = [torch.stack([ref(r, seed + i, s, dtype) for r in ranks]).sum(0) for i, s in enumerate(shapes)]
            for in_place in (False, True):
                for asynchronous in (False, True):
                    ts = [data(me, seed + i, s, dtype) for i, s in enumerate(shapes)]
                    tag = f"grouped_allreduce {label} {dtype} in_place={in_place} async={asynchronous}"
                    if in_place:
                        run(hvd.grouped_allreduce_, hvd.grouped_allreduce_async_ if asynchronous else None, ts,
                            op=hvd.Sum, process_set=ps)
                        got = ts
                    else:
                        got = run(hvd.grouped_allreduce, hvd.grouped_allreduce_async if asynchronous else None, ts,
                                  op=hvd.Sum, process_set=ps)
                    for g, w in zip(got, wants):
                        close(g, w.to(dtype), dtype, tag, failures)
            if dtype in FLOATS:  # pre/postscale: (sum of x * 0.5) * 3
                t = data(me, seed, (4,), dtype)
                want = torch.stack([ref(r, seed, (4,), dtype) for r in ranks]).sum(0) * 1.5
                close(hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0, process_set=ps),
                      want.to(dtype), dtype, f"scaled allreduce {label} {dtype}", failures)
    report(failures)


@case
def matrix_gather_broadcast_alltoall_reducescatter():
    me, failures, seed = hvd.rank(), [], 200
    for label, ps, ranks in process_sets():
        if me not in ranks:
            continue
        n, mine = len(ranks), ranks.index(me)
        for dtype in DTYPES:
            seed += 1
            for asynchronous in (False, True):
                tag = f"{label} {dtype} async={asynchronous}"
                got = run(hvd.allgather, hvd.allgather_async if asynchronous else None,
                          data(me, seed, (mine + 1, 2), dtype), process_set=ps)
                close(got, torch.cat([ref(r, seed, (i + 1, 2), dtype) for i, r in enumerate(ranks)]), dtype,
                      "allgather " + tag, failures)
                got = run(hvd.grouped_allgather, hvd.grouped_allgather_async if asynchronous else None,
                          [data(me, seed, (mine + 1,), dtype), data(me, seed + 1, (1, 3), dtype)], process_set=ps)
                close(got[1], torch.cat([data(r, seed + 1, (1, 3), dtype) for r in ranks]), dtype,
                      "grouped_allgather " + tag, failures)
                root = ranks[-1]
                got = run(hvd.broadcast, hvd.broadcast_async if asynchronous else None,
                          data(me, seed, (3,), dtype), root, process_set=ps)
                close(got, data(root, seed, (3,), dtype), dtype, "broadcast " + tag, failures)
                t = data(me, seed, (3,), dtype)
                run(hvd.broadcast_, hvd.broadcast_async_ if asynchronous else None, t, root, process_set=ps)
                close(t, data(root, seed, (3,), dtype), dtype, "broadcast_ " + tag, failures)
                splits = [1 + (i + mine) % 2 for i in range(n)]  # rows for set rank i
                x = torch.cat([torch.full((s, 2), 10 * mine + i).to(dtype) for i, s in enumerate(splits)])
                got = run(hvd.alltoall, hvd.alltoall_async if asynchronous else None, x, splits=splits,
                          process_set=ps)
                want = torch.cat([torch.full((1 + (mine + i) % 2, 2), 10 * i + mine) for i in range(n)]).to(dtype)
                close(got[0], want, dtype, "alltoall " + tag, failures)
                for op in ((hvd.Sum, hvd.Average) if dtype in FLOATS else (hvd.Sum,)):
                    rows = 2 * n + 1
                    full = REDUCE[op](torch.stack([ref(r, seed, (rows, 2), dtype) for r in ranks]))
                    lo = mine * 2 + min(mine, 1)
                    hi = lo + 2 + (1 if mine < 1 else 0)
                    got = run(hvd.reducescatter, hvd.reducescatter_async if asynchronous else None,
                              data(me, seed, (rows, 2), dtype), op=op, process_set=ps)
                    close(got, full[lo:hi].to(dtype), dtype, f"reducescatter op={op} " + tag, failures)
                    got = run(hvd.grouped_reducescatter, hvd.grouped_reducescatter_async if asynchronous else None,
                              [data(me, seed, (rows, 2), dtype)], op=op, process_set=ps)
                    close(got[0], full[lo:hi].to(dtype), dtype, f"grouped_reducescatter op={op} " + tag, failures)
    report(failures)


@case
def matrix_autograd():
    """Closed-form gradients of every differentiable op, float32 and float64, both process sets."""
    me, failures = hvd.rank(), []
    for label, ps, ranks in process_sets():
        if me not in ranks:
            continue
        n, mine = len(ranks), ranks.index(me)
        for dtype in (torch.float32, torch.float64):
            tag = f"{label} {dtype}"
            for op, scale in ((hvd.Sum, n), (hvd.Average, 1.0)):
                x = torch.ones(3, dtype=dtype, requires_grad=True)
                hvd.allreduce(x, op=op, process_set=ps).sum().backward()  # grad: allreduce(ones, op)
                close(x.grad, torch.full((3,), float(scale), dtype=dtype), dtype, f"allreduce op={op} " + tag, failures)
                xs = [torch.ones(2, dtype=dtype, requires_grad=True), torch.ones(1, dtype=dtype, requires_grad=True)]
                sum(y.sum() for y in hvd.grouped_allreduce(xs, op=op, process_set=ps)).backward()
                close(xs[1].grad, torch.full((1,), float(scale), dtype=dtype), dtype, f"grouped_allreduce {op} " + tag,
                      failures)
                x = torch.ones(2 * n, dtype=dtype, requires_grad=True)
                hvd.reducescatter(x, op=op, process_set=ps).sum().backward()
                close(x.grad, torch.full((2 * n,), float(scale), dtype=dtype), dtype, f"reducescatter {op} " + tag,
                      failures)
            x = torch.ones(mine + 1, dtype=dtype, requires_grad=True)
            g = hvd.allgather(x, process_set=ps)
            (g * torch.arange(g.shape[0], dtype=dtype)).sum().backward()
            off = sum(i + 1 for i in range(mine))
            close(x.grad, torch.arange(off, off + mine + 1, dtype=dtype), dtype, "allgather " + tag, failures)
            x = torch.ones(2, dtype=dtype, requires_grad=True)
            (hvd.broadcast(x, ranks[0], process_set=ps) * 2).sum().backward()
            close(x.grad, torch.full((2,), 2.0 if mine == 0 else 0.0, dtype=dtype), dtype, "broadcast " + tag, failures)
            x = torch.ones(n, dtype=dtype, requires_grad=True)
            (hvd.alltoall(x, process_set=ps) * (torch.arange(n, dtype=dtype) + 1)).sum().backward()
            close(x.grad, torch.full((n,), float(mine + 1), dtype=dtype), dtype, "alltoall " + tag, failures)
    report(failures)
