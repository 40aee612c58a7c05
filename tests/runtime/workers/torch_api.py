"""Rank-side checks of Horovod torch API gaps (run by tests/runtime/test_torch_api.py on 2, 3, 4 ranks):
grouped allgather/reducescatter, reducescatter scaling, float16 prescale rounding, sparse gradients,
broadcast_optimizer_state, join with allgather/broadcast, gradient conventions, process-set
optimizers, SyncBatchNorm. References are computed in float64 from every rank's (reproducible) data."""
import os
import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
import trainrun.torch as hvd  # noqa: E402
from harness import case, expect, main  # noqa: E402


def data(rank, seed, shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    return torch.randint(-3, 4, shape, generator=g).to(dtype)


def every(seed, shape, dtype=torch.float64, rows=None):
    """Every rank's data(r, ...) (rows: the first dim per rank, else shape's)."""
    return [data(r, seed, ((rows(r),) + tuple(shape[1:])) if rows else shape, dtype) for r in range(hvd.size())]


def close(got, want, tol=1e-6):
    torch.testing.assert_close(got.to(torch.float64), want.to(torch.float64), rtol=tol, atol=tol)


def my_rows(total, me, n):
    base, extra = divmod(total, n)
    start = me * base + min(me, extra)
    return slice(start, start + base + (1 if me < extra else 0))


@case
def grouped_allgather_and_reducescatter():
    me, n = hvd.rank(), hvd.size()
    ts = [data(me, 1, (me + 1, 3)), data(me, 2, (2 * me + 1,), torch.int32)]
    outs = hvd.grouped_allgather(ts)
    close(outs[0], torch.cat(every(1, (0, 3), rows=lambda r: r + 1)))
    assert outs[1].dtype == torch.int32
    close(outs[1], torch.cat(every(2, (0,), rows=lambda r: 2 * r + 1)))
    outs = hvd.synchronize(hvd.grouped_allgather_async(ts, name="ga"))
    close(outs[0], torch.cat(every(1, (0, 3), rows=lambda r: r + 1)))
    xs = [data(me, 3, (2 * n + 1, 2)), data(me, 4, (n,))]
    for op, reduce in ((hvd.Sum, lambda s: torch.stack(s).sum(0)), (hvd.Average, lambda s: torch.stack(s).mean(0))):
        outs = hvd.grouped_reducescatter(xs, op=op)
        close(outs[0], reduce(every(3, (2 * n + 1, 2)))[my_rows(2 * n + 1, me, n)])
        close(outs[1], reduce(every(4, (n,)))[my_rows(n, me, n)])
        h = hvd.grouped_reducescatter_async(xs, op=op, prescale_factor=0.5, postscale_factor=3.0)
        outs = hvd.synchronize(h)
        close(outs[0], 1.5 * reduce(every(3, (2 * n + 1, 2)))[my_rows(2 * n + 1, me, n)])
    got = hvd.reducescatter(xs[0], op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
    close(got, 0.5 * torch.stack(every(3, (2 * n + 1, 2))).sum(0)[my_rows(2 * n + 1, me, n)])
    got = hvd.synchronize(hvd.reducescatter_async(xs[0], op=hvd.Average, prescale_factor=2.0))
    close(got, 2.0 * torch.stack(every(3, (2 * n + 1, 2))).mean(0)[my_rows(2 * n + 1, me, n)])
    assert hvd.grouped_allgather([]) == []


@case
def float16_prescale_rounds_as_horovod():
    """Horovod's test_horovod_allreduce_prescale: the scaled float16 is rounded to float16 first."""
    n = hvd.size()
    for dim in (1, 2):
        torch.manual_seed(1234)
        np.random.seed(1234)
        factor = np.random.uniform()
        tensor = torch.FloatTensor(*([17] * dim)).random_(-100, 100).half()
        summed = hvd.allreduce(tensor, op=hvd.Sum, prescale_factor=factor)
        scaled = (torch.tensor(factor, dtype=torch.float64).float() * tensor.float()).half()  # rounded: Horovod
        # the sum itself runs in float32 and is rounded to float16 once (Horovod sums pairwise in float16)
        assert torch.equal(summed, (scaled.float() * n).half()), (summed, scaled)


@case
def sparse_allreduce_async_direct():
    me, n = hvd.rank(), hvd.size()
    idx = torch.tensor([[me, 0]])  # row `me`, and row 0 on every rank
    sp = torch.sparse_coo_tensor(idx, torch.ones(2, 3) * (me + 1), (n, 3), check_invariants=True)
    h = hvd.sparse_allreduce_async(sp, name="sp", op=hvd.Sum)
    out = h()  # callable, as Horovod's
    want = torch.zeros(n, 3)
    for r in range(n):
        want[r] += r + 1
        want[0] += r + 1
    close(out.to_dense(), want)
    out = hvd.synchronize(hvd.sparse_allreduce_async(sp, name="sp2", op=hvd.Average))
    close(out.to_dense(), want / n)


def _embedding_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Embedding(20, 4, sparse=True), nn.Flatten(), nn.Linear(12, 1))


def _batch(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randint(0, 20, (5, 3), generator=g), torch.randn(5, 1, generator=g)


@case
def sparse_gradients_both_ways():
    """Sparse gradients reduced as Horovod does (allgather) or dense, alone or in groups= with dense
    gradients (the sparse one then goes on its own unless sparse_as_dense)."""
    me, n = hvd.rank(), hvd.size()
    for sparse_as_dense, grouped in ((False, False), (True, False), (False, True), (True, True)):
        model, ref = _embedding_model(), _embedding_model()
        groups = [list(model.parameters())] if grouped else None
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), groups=groups,
                                       named_parameters=model.named_parameters(), sparse_as_dense=sparse_as_dense)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for step in range(3):
            opt.zero_grad()
            x, y = _batch(step, me)
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            ref_opt.zero_grad()
            for r in range(n):  # the average of every rank's gradient = mean of their losses
                x, y = _batch(step, r)
                (nn.functional.mse_loss(ref(x), y) / n).backward()
            ref_opt.step()
        for p, q in zip(model.parameters(), ref.parameters()):
            close(p.detach(), q.detach(), 1e-5)


# every optimizer class torch ships (LBFGS: refused, as in Horovod); extra arguments where needed
OPTIMIZERS = sorted((c for c in vars(torch.optim).values() if isinstance(c, type)
                     and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer
                     and c is not torch.optim.LBFGS), key=lambda c: c.__name__)
EXTRA = {torch.optim.SGD: dict(momentum=0.9), torch.optim.RMSprop: dict(momentum=0.5)}


@case
def broadcast_optimizer_state_every_class():
    me = hvd.rank()
    assert len(OPTIMIZERS) >= 12, OPTIMIZERS
    for cls in OPTIMIZERS:
        torch.manual_seed(0)
        model = (nn.Embedding(6, 2, sparse=True) if cls is torch.optim.SparseAdam
                 else nn.Linear(3, 2, bias=cls.__name__ != "Muon"))  # (Muon: 2-D parameters only)
        opt = cls(model.parameters(), lr=0.01 * (me + 1), **EXTRA.get(cls, {}))
        hvd.broadcast_optimizer_state(opt, root_rank=0)  # no gradient, no state yet
        assert abs(opt.param_groups[0]["lr"] - 0.01) < 1e-12, (cls.__name__, opt.param_groups[0]["lr"])
        if me == 0:  # only the root has stepped: its state must reach the others
            x = torch.arange(2) if cls is torch.optim.SparseAdam else torch.ones(4, 3)
            model(x).sum().backward()
            opt.step()
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        states = hvd.allgather_object({k: {n: (v.tolist() if torch.is_tensor(v) else v) for n, v in s.items()}
                                       for k, s in opt.state_dict()["state"].items()})
        assert all(s == states[0] for s in states), cls.__name__
        assert len(states[0]) > 0, cls.__name__
    expect(ValueError, lambda: hvd.broadcast_optimizer_state(torch.optim.LBFGS(nn.Linear(2, 2).parameters()), 0),
           "LBFGS")


@case
def broadcast_parameters_without_grad():
    torch.manual_seed(hvd.rank())
    model = nn.Linear(3, 2)
    model.weight.requires_grad_(False)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    got = hvd.allgather_object(model.weight.tolist())
    assert all(g == got[0] for g in got)


@case
def join_with_allgather_and_broadcast():
    me, n = hvd.rank(), hvd.size()
    last = n - 1
    if me == last:
        assert hvd.join() in range(n - 1)  # the rank that joined last
    else:
        got = hvd.allgather(torch.full((me + 1, 2), float(me)))
        want = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(n - 1)])
        close(got, want)
        h = hvd.allgather_async(torch.full((1,), float(me)))
        close(hvd.synchronize(h), torch.arange(n - 1, dtype=torch.float32))
        got = hvd.broadcast(torch.full((3,), float(me)), root_rank=0)
        close(got, torch.zeros(3))
        t = torch.full((3,), float(me))
        hvd.synchronize(hvd.broadcast_async_(t, root_rank=0))
        close(t, torch.zeros(3))
        close(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n - 1)))
        if me == 0:
            expect(hvd.HorovodInternalError, lambda: hvd.broadcast(torch.ones(2), root_rank=last, name="rootjoined"),
                   "rootjoined", "join")
        assert hvd.join() in range(n - 1)
    hvd.barrier()


@case
def collective_gradients_follow_horovod():
    me, n = hvd.rank(), hvd.size()
    for op, want in ((hvd.Sum, float(n)), (hvd.Average, 1.0)):
        x = torch.ones(2 * n, 3, requires_grad=True)
        hvd.reducescatter(x, op=op).backward(torch.ones(2, 3))
        close(x.grad, torch.full((2 * n, 3), want))
        xs = [torch.ones(n, requires_grad=True), torch.ones(2 * n, 2, requires_grad=True)]
        outs = hvd.grouped_reducescatter(xs, op=op)
        sum(o.sum() for o in outs).backward()
        for x in xs:
            close(x.grad, torch.full(x.shape, want))
    x = torch.ones(n, requires_grad=True)
    hvd.reducescatter(x, op=hvd.Sum, prescale_factor=2.0).sum().backward()
    close(x.grad, torch.full((n,), 2.0 * n))
    # alltoall: rank me sends row r (value 10*me + r) to rank r; the gradient comes back reversed
    x = (torch.arange(n, dtype=torch.float32) + 10 * me).requires_grad_()
    out = hvd.alltoall(x)
    close(out.detach(), torch.arange(n, dtype=torch.float32) * 10 + me)
    (out * (torch.arange(n) + 1)).sum().backward()  # d/d out[r] = r + 1, out[r] came from rank r's x[me]
    close(x.grad, torch.full((n,), float(me + 1)))
    splits = [1 + (r + me) % 2 for r in range(n)]
    x = torch.ones(sum(splits), 2, requires_grad=True)
    out, received = hvd.alltoall(x, splits=splits)
    assert not received.requires_grad
    (out * 3).sum().backward()
    close(x.grad, torch.full(x.shape, 3.0))
    xs = [torch.ones(me + 1, requires_grad=True), torch.ones(2, 2, requires_grad=True)]
    outs = hvd.grouped_allgather(xs)
    (outs[0] * torch.arange(outs[0].shape[0])).sum().backward()  # Average over ranks of the same gradient
    offset = sum(r + 1 for r in range(me))
    close(xs[0].grad, torch.arange(offset, offset + me + 1, dtype=torch.float32))


@case
def optimizer_on_disjoint_process_sets():
    me, n = hvd.rank(), hvd.size()
    even = hvd.add_process_set([r for r in range(n) if r % 2 == 0])
    odd = hvd.add_process_set([r for r in range(n) if r % 2 == 1])
    try:
        mine = even if me % 2 == 0 else odd
        members = mine.ranks
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), process_set=mine)
        x = torch.full((2, 3), float(me + 1))
        model(x).sum().backward()
        opt.step()
        torch.manual_seed(0)
        ref = nn.Linear(3, 1)
        for r in members:
            (ref(torch.full((2, 3), float(r + 1))).sum() / len(members)).backward()
        with torch.no_grad():
            for p in ref.parameters():
                p -= 0.1 * p.grad
        for p, q in zip(model.parameters(), ref.parameters()):
            close(p.detach(), q.detach(), 1e-5)
    finally:
        hvd.remove_process_set(odd)
        hvd.remove_process_set(even)



@case
def optimizer_on_a_set_without_this_rank_trains_locally():
    """DistributedOptimizer(process_set=S) on a rank outside S: its own gradients, no collective (Horovod)."""
    me = hvd.rank()
    first = hvd.add_process_set([0])
    try:
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), process_set=first)
        model(torch.full((2, 3), float(me + 1))).sum().backward()
        opt.step()
        torch.manual_seed(0)
        ref = nn.Linear(3, 1)
        ref(torch.full((2, 3), float(me + 1))).sum().backward()
        with torch.no_grad():
            for p in ref.parameters():
                p -= 0.1 * p.grad
        for p, q in zip(model.parameters(), ref.parameters()):
            close(p.detach(), q.detach(), 1e-6)
    finally:
        hvd.remove_process_set(first)


@case
def sparse_as_dense_hands_sparse_adam_sparse_gradients():
    """sparse_as_dense=True reduces an embedding's gradient dense and hands it back sparse, so
    torch.optim.SparseAdam steps; the result equals single-process SparseAdam on every rank's batch."""
    me, n = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    model, ref = nn.Embedding(6, 2, sparse=True), nn.Embedding(6, 2, sparse=True)
    ref.load_state_dict(model.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), sparse_as_dense=True)
    ref_opt = torch.optim.SparseAdam(ref.parameters(), lr=0.1)
    for step in range(2):
        opt.zero_grad()
        model(torch.tensor([(me + step) % 6, 5])).sum().backward()
        opt.step()
        assert model.weight.grad.is_sparse
        ref_opt.zero_grad()
        for r in range(n):
            (ref(torch.tensor([(r + step) % 6, 5])).sum() / n).backward()
        ref_opt.step()
    close(model.weight.detach(), ref.weight.detach(), 1e-5)


@case
def broadcast_optimizer_state_leaves_zero_gradients():
    """After broadcast_optimizer_state of a fresh optimizer, parameters that require grad have zero
    gradients (Horovod's), so a program that then broadcasts the gradients runs."""
    model = nn.Linear(3, 2)
    model.bias.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert model.weight.grad is not None and not model.weight.grad.any()
    assert model.bias.grad is None
    hvd.broadcast_(model.weight.grad, root_rank=0)


@case
def reducescatter_adasum_raises_horovods_error_type():
    """Horovod raises RuntimeError for reducescatter(op=Adasum), in every form."""
    n = hvd.size()
    for call in (lambda: hvd.reducescatter(torch.ones(2 * n), op=hvd.Adasum),
                 lambda: hvd.reducescatter_async(torch.ones(2 * n), op=hvd.Adasum),
                 lambda: hvd.grouped_reducescatter([torch.ones(2 * n)], op=hvd.Adasum),
                 lambda: hvd.grouped_reducescatter_async([torch.ones(2 * n)], op=hvd.Adasum)):
        expect(RuntimeError, call, "Adasum")

@case
def sync_batch_norm_matches_global_batch_norm():
    me, n = hvd.rank(), hvd.size()
    xs = [torch.randn(3 + r, 4, 5, generator=torch.Generator().manual_seed(r)) * (r + 1) for r in range(n)]
    torch.manual_seed(0)
    sbn = hvd.SyncBatchNorm(4)
    bn = nn.BatchNorm1d(4)
    with torch.no_grad():
        sbn.weight.copy_(torch.linspace(0.5, 2, 4))
        bn.weight.copy_(torch.linspace(0.5, 2, 4))
    x = xs[me].clone().requires_grad_()
    w = torch.arange(5.0)
    (sbn(x) * w).sum().backward()
    full = torch.cat(xs).requires_grad_()
    (bn(full) * w).sum().backward()
    rows = slice(sum(3 + r for r in range(me)), sum(3 + r for r in range(me + 1)))
    close(sbn.running_mean, bn.running_mean, 1e-5)
    close(sbn.running_var, bn.running_var, 1e-5)
    close(x.grad, full.grad[rows], 1e-4)
    close(hvd.allreduce(sbn.weight.grad, op=hvd.Sum), bn.weight.grad, 1e-4)  # each rank's share of the loss
    sbn.eval()
    bn.eval()
    close(sbn(xs[me]), bn(xs[me]), 1e-5)


def _adasum_tree(vs):
    """Reference Adasum (float64 lists of tensors): pairs (0,1), (2,3), ..., an odd last one carried up."""
    while len(vs) > 1:
        nxt = []
        for a, b in zip(vs[0::2], vs[1::2]):
            dot, na, nb = float(a @ b), float(a @ a), float(b @ b)
            nxt.append((1 - dot / (2 * na) if na else 1) * a + (1 - dot / (2 * nb) if nb else 1) * b)
        vs = nxt + ([vs[-1]] if len(vs) % 2 else [])
    return vs[0]


@case
def adasum_any_world_size():
    me, n = hvd.rank(), hvd.size()
    e = torch.zeros(n, dtype=torch.float64)
    e[me] = 2.0  # orthogonal: the sum
    close(hvd.allreduce(e, op=hvd.Adasum), torch.full((n,), 2.0))
    same = torch.arange(5, dtype=torch.float32)  # parallel and equal: the vector itself
    close(hvd.allreduce(same, op=hvd.Adasum), same, 1e-6)
    vs = [torch.randn(7, generator=torch.Generator().manual_seed(r), dtype=torch.float64) for r in range(n)]
    want = _adasum_tree(list(vs))
    close(hvd.allreduce(vs[me].view(7, 1), op=hvd.Adasum), want.view(7, 1), 1e-12)
    t = vs[me].float().clone()
    hvd.synchronize(hvd.allreduce_async_(t, op=hvd.Adasum, prescale_factor=2.0))
    close(t, 2 * want, 1e-5)
    close(hvd.synchronize(hvd.allreduce_async(vs[me].half(), op=hvd.Adasum)), want, 5e-3)
    x = vs[me].clone().requires_grad_()
    hvd.allreduce(x, op=hvd.Adasum).sum().backward()  # gradient: Adasum of the (equal) output gradients
    close(x.grad, torch.ones(7), 1e-12)
    expect(ValueError, lambda: hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Adasum), "Adasum", "float")
    expect(RuntimeError, lambda: hvd.reducescatter(torch.ones(2), op=hvd.Adasum), "Adasum")  # (Horovod's type)


@case
def adasum_optimizer_combines_deltas():
    """DistributedOptimizer(op=Adasum): every rank steps its own optimizer (momentum state per rank) on
    its own batch; the parameters move by the Adasum, per parameter tensor, of the ranks' deltas."""
    me, n = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    model = nn.Linear(4, 3).double()
    local = [nn.Linear(4, 3).double() for _ in range(n)]  # the reference: every rank's own optimizer
    local_opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in local]
    ref = [p.detach().clone() for p in model.parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    data = [(torch.randn(5, 4, generator=torch.Generator().manual_seed(10 + r), dtype=torch.float64),
             torch.randn(5, 3, generator=torch.Generator().manual_seed(20 + r), dtype=torch.float64)) for r in range(n)]
    for _ in range(3):
        x, y = data[me]
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        deltas = []
        for m, o, (xr, yr) in zip(local, local_opts, data):
            with torch.no_grad():
                for q, r in zip(m.parameters(), ref):
                    q.copy_(r)
            o.zero_grad()
            ((m(xr) - yr) ** 2).mean().backward()
            o.step()
            deltas.append([(q - r).detach() for q, r in zip(m.parameters(), ref)])
        ref = [r + _adasum_tree([d[i].reshape(-1) for d in deltas]).view_as(r) for i, r in enumerate(ref)]
        for p, r in zip(model.parameters(), ref):
            close(p, r, 1e-10)
    if n > 1:
        sets = hvd.add_process_set([0])
        try:
            expect(NotImplementedError, lambda: hvd.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum, process_set=sets), "process sets")
        finally:
            hvd.remove_process_set(sets)
        expect(ValueError, lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                            op=hvd.Adasum, groups=2), "groups")


@case
def build_probes_tell_the_truth():
    from mpi4py import MPI
    assert hvd.mpi_enabled() and hvd.mpi_built()
    assert not (hvd.gloo_enabled() or hvd.gloo_built() or hvd.ccl_built() or hvd.ddl_built() or hvd.rocm_built())
    assert hvd.mpi_threads_supported() == (MPI.Query_thread() >= MPI.THREAD_MULTIPLE)
    assert hvd.cuda_built() == torch.backends.cuda.is_built()
    expect(NotImplementedError, lambda: hvd.start_timeline("/tmp/x.json"), "TRAINRUN_TIMELINE")


import torch_matrix  # noqa: E402,F401  (its cases run after these: one launch per world size)

if __name__ == "__main__":
    main(hvd)
