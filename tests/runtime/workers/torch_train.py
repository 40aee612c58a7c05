"""DistributedOptimizer against single-process training (run by tests/runtime/test_torch.py).

Every rank also trains the single-process reference on the concatenation of all ranks' batches (the
data is a function of (step, rank) only), so the comparison needs no extra launch.
"""
import dataclasses
import os
import sys
import warnings
from contextlib import contextmanager

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
import trainrun.torch as hvd  # noqa: E402
from harness import case, main  # noqa: E402

BATCH, STEPS = 8, 4


def cnn(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 4 * 4, 10), nn.BatchNorm1d(10))


def batch(step, rank, micro=0):
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    return torch.randn(BATCH, 1, 8, 8, generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def loss_of(model, x, y):
    return nn.functional.cross_entropy(model(x), y)


def params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def train(micro_steps=1, **opt_kwargs):
    """(distributed model, reference model) after STEPS steps of SGD with momentum."""
    model, ref = cnn(), cnn()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=micro_steps, **opt_kwargs)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        ref_opt.zero_grad()
        for m in range(micro_steps):
            loss_of(model, *batch(step, hvd.rank(), m)).backward()
            # the reference runs each rank's shard through the model (BatchNorm sees the same batches)
            # and averages the losses: the gradient the ranks' averaged gradients must equal
            ref_loss = sum(loss_of(ref, *batch(step, r, m)) for r in range(hvd.size())) / hvd.size()
            ref_loss.backward()
        opt.step()
        ref_opt.step()
    return model, ref


def assert_identical_across_ranks(model):
    mine = params(model)
    everyone = hvd.allgather(mine.unsqueeze(0))
    for r in range(hvd.size()):
        assert torch.equal(everyone[r], mine), f"rank {r}'s parameters differ from rank {hvd.rank()}'s"


@case
def matches_single_process():
    model, ref = train()
    assert_identical_across_ranks(model)
    torch.testing.assert_close(params(model), params(ref), rtol=1e-5, atol=1e-5)
    assert not torch.equal(params(model), params(cnn())), "training did not change the model"


@case
def backward_passes_per_step_2():
    model, ref = train(micro_steps=2)
    assert_identical_across_ranks(model)
    torch.testing.assert_close(params(model), params(ref), rtol=1e-5, atol=1e-5)


@case
def fp16_compression():
    model, ref = train(compression=hvd.Compression.fp16)
    assert_identical_across_ranks(model)
    torch.testing.assert_close(params(model), params(ref), rtol=1e-2, atol=2e-3)


@case
def groups():
    for groups in (2, None):
        model, ref = train(groups=groups, gradient_predivide_factor=2.0)
        assert_identical_across_ranks(model)
        torch.testing.assert_close(params(model), params(ref), rtol=1e-5, atol=1e-5)


@case
def gradient_batches():
    """With buckets off (TRAINRUN_BUCKET_BYTES=0: Horovod's per-gradient allreduces), gradients start in
    batches (optimizer.BATCH_BYTES), each its own named allreduce: none during backward for a small
    model (one submit of all in synchronize), one submit per gradient with 1-byte batches, and the same
    training result either way."""
    from trainrun.torch import optimizer

    submits, real_submit, eng = counting_submits()
    try:
        with bucket_bytes(0):
            model = cnn()
            names = sorted(n for n, _ in model.named_parameters())
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
            loss_of(model, *batch(0, hvd.rank())).backward()
            assert submits == [], f"allreduces started during backward of a small model: {submits}"
            opt.step()
            assert submits == [names], submits
            try:
                loss_of(model, *batch(1, hvd.rank())).backward()
                loss_of(model, *batch(1, hvd.rank())).backward()  # a second pass before step(), with batches pending
            except AssertionError as e:
                assert "backward_passes_per_step" in str(e), e
            else:
                raise AssertionError("a second backward pass before step() did not raise")
            opt.synchronize()
            opt.zero_grad()

            submits.clear()
            saved = optimizer.BATCH_BYTES
            optimizer.BATCH_BYTES = 1
            try:
                model, ref = train()
            finally:
                optimizer.BATCH_BYTES = saved
            assert len(submits) == STEPS * len(names) and all(len(s) == 1 for s in submits), submits
    finally:
        eng.submit = real_submit
    assert_identical_across_ranks(model)
    torch.testing.assert_close(params(model), params(ref), rtol=1e-5, atol=1e-5)


@contextmanager
def bucket_bytes(n: int):
    """Run with the runtime's TRAINRUN_BUCKET_BYTES setting (read from the environment at init, once)
    as `n`: the optimizers made inside plan their buckets with it."""
    from trainrun.runtime.context import RUNTIME

    session = RUNTIME.current()
    saved = session.settings
    session.settings = dataclasses.replace(saved, bucket_bytes=n)
    try:
        yield
    finally:
        session.settings = saved


def counting_submits():
    """([sorted names of each submit], the engine's real submit, the engine) with the engine's submit
    counting into the list until the caller puts the real one back."""
    from trainrun.runtime import lifecycle

    eng = lifecycle.engine(None)
    submits = []
    real_submit = eng.submit

    def counting(reqs, **kw):
        submits.append(sorted(r.name for r in reqs))
        return real_submit(reqs, **kw)

    eng.submit = counting
    return submits, real_submit, eng


@case
def buckets():
    """With no groups given, CPU gradients go in buckets (torch/buckets.py): the small model's are one
    bucket, one request started by the last gradient's hook during backward; a 600-byte cap makes
    several, one submit each, every one started before step(); training matches the single-process
    reference either way (a bad TRAINRUN_BUCKET_BYTES: tests/unit/test_horovod_env.py)."""
    submits, real_submit, eng = counting_submits()
    try:
        model = cnn()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
        loss_of(model, *batch(0, hvd.rank())).backward()
        assert len(submits) == 1 and len(submits[0]) == 1 and submits[0][0].startswith("bucket."), submits
        opt.step()
        assert len(submits) == 1, f"step() submitted more: {submits}"
        model, ref = train()
        assert_identical_across_ranks(model)
        torch.testing.assert_close(params(model), params(ref), rtol=1e-5, atol=1e-5)

        submits.clear()
        with bucket_bytes(600):
            model, ref = train()
        from trainrun.torch.buckets import plan
        n = len(plan(list(cnn().parameters()), 600))
        assert n >= 3, f"a 600-byte cap made {n} bucket(s)"
        assert len(submits) == STEPS * n and all(len(s) == 1 and s[0].startswith("bucket.") for s in submits), submits
        assert_identical_across_ranks(model)
        torch.testing.assert_close(params(model), params(ref), rtol=1e-5, atol=1e-5)

    finally:
        eng.submit = real_submit


@case
def sparse_and_unused_in_bucket():
    """A bucket holding an embedding with sparse gradients (reduced on its own, or dense with
    sparse_as_dense) and a layer that took no part in the loss (reduced as zeros): every rank ends with
    the reference's parameters, the unused layer unchanged."""
    for sparse_as_dense in (False, True):
        def make():
            torch.manual_seed(0)
            return nn.ModuleDict({"emb": nn.Embedding(20, 4, sparse=True), "lin": nn.Linear(4, 2),
                                  "unused": nn.Linear(4, 2)})

        model, ref = make(), make()
        start = params(model["unused"]).clone()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                                       sparse_as_dense=sparse_as_dense)
        assert len(opt._groups) == 1 and len(opt._groups[0]) == 5, [len(g) for g in opt._groups]
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)

        def loss(m, rank, step):
            ids = torch.randint(0, 20, (6,), generator=torch.Generator().manual_seed(100 * step + rank))
            return m["lin"](m["emb"](ids)).pow(2).mean()

        for step in range(3):
            opt.zero_grad()
            ref_opt.zero_grad()
            loss(model, hvd.rank(), step).backward()
            (sum(loss(ref, r, step) for r in range(hvd.size())) / hvd.size()).backward()
            opt.step()
            ref_opt.step()
        assert_identical_across_ranks(model)
        torch.testing.assert_close(params(model), params(ref), rtol=1e-5, atol=1e-5)
        assert torch.equal(params(model["unused"]), start)


@case
def unused_parameter_in_group():
    torch.manual_seed(0)
    used, unused = nn.Linear(4, 3), nn.Linear(4, 3)
    model = nn.ModuleDict({"used": used, "unused": unused})
    start = params(model).clone()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), groups=[list(model.parameters())])
    for step in range(2):
        opt.zero_grad()
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(step * 10 + hvd.rank()))
        used(x).pow(2).mean().backward()  # `unused` gets no gradient: synchronize() reduces zeros for it
        opt.step()
    assert_identical_across_ranks(model)
    assert torch.equal(torch.cat([p.reshape(-1) for p in unused.parameters()]),
                       start[-sum(p.numel() for p in unused.parameters()):])


@case
def broadcast_makes_diverged_ranks_identical():
    model = cnn(seed=hvd.rank())  # different initial weights per rank
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (hvd.rank() + 1))
    loss_of(model, *batch(0, hvd.rank())).backward()
    opt.step()  # different optimizer state per rank too
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert_identical_across_ranks(model)
    buffers = torch.cat([b.reshape(-1).float() for b in model.buffers()])
    assert hvd.allgather_object(buffers.tolist()) == [buffers.tolist()] * hvd.size()
    state = [(k, v.tolist()) for s in opt.state_dict()["state"].values() for k, v in sorted(s.items())]
    assert hvd.allgather_object(state) == [state] * hvd.size()
    assert hvd.allgather_object(opt.param_groups[0]["lr"]) == [0.01] * hvd.size()
    fresh = torch.optim.SGD(model.parameters(), lr=0.5 + hvd.rank(), momentum=0.9)  # no state yet
    hvd.broadcast_optimizer_state(fresh, root_rank=1)
    assert fresh.param_groups[0]["lr"] == 1.5
    model2 = cnn(seed=10 + hvd.rank())
    hvd.broadcast_parameters(model2.named_parameters(), root_rank=1)
    assert torch.equal(params(model2), params(cnn(seed=11)))


@case
def synchronize_then_skip():
    model = cnn()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
    loss_of(model, *batch(0, hvd.rank())).backward()
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with opt.skip_synchronize():
        opt.step()
    assert_identical_across_ranks(model)
    loss_of(model, *batch(1, hvd.rank())).backward()
    try:
        opt.zero_grad()
    except AssertionError:
        pass
    else:
        raise AssertionError("zero_grad with pending allreduces did not raise")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt.step()


@case
def optimizer_errors():
    model = cnn()
    named = list(model.named_parameters())
    for kwargs in ({"named_parameters": named[:1]}, {"named_parameters": [("a", p) for _, p in named]},
                   {"named_parameters": named, "op": hvd.Sum, "gradient_predivide_factor": 2.0}):
        try:
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)
        except ValueError:
            continue
        raise AssertionError(f"no ValueError for {list(kwargs)}")


if __name__ == "__main__":
    main(hvd)
