"""Process sets on 4 ranks (run by tests/runtime/test_process_sets.py): sets run their collectives
independently, errors for non-members and misuse, removal, DistributedOptimizer per set, init(process_sets=)."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import torch  # noqa: E402

import trainrun.runtime as hvd  # noqa: E402
import trainrun.torch as thvd  # noqa: E402
from harness import case, expect, main  # noqa: E402

SETS = {}


def mine():
    """(my set, its global ranks): even ranks {0, 2}, odd ranks {1, 3}."""
    me = hvd.rank()
    ps = SETS["even"] if me % 2 == 0 else SETS["odd"]
    return ps, ps.ranks


@case
def sets_run_collectives_independently():
    assert hvd.size() == 4
    SETS["even"] = hvd.add_process_set([0, 2])
    SETS["odd"] = hvd.add_process_set(hvd.ProcessSet([3, 1]))
    me = hvd.rank()
    ps, ranks = mine()
    assert ps.ranks == sorted(ranks) and ps.size() == 2 and ps.rank() == ranks.index(me) and ps.included()
    other = SETS["odd"] if ps is SETS["even"] else SETS["even"]
    assert not other.included() and other.rank() == -1
    assert [p.process_set_id for p in hvd.process_sets()] == [0, ps.process_set_id, other.process_set_id][:1] + sorted(
        [ps.process_set_id, other.process_set_id])
    # the same names on both sets at once: each set matches its own
    got = hvd.allreduce(np.full(3, float(me)), name="ps.x", op=hvd.Sum, process_set=ps)
    np.testing.assert_array_equal(got, np.full(3, float(sum(ranks))))
    np.testing.assert_allclose(hvd.allreduce(np.full(2, float(me)), name="ps.avg", process_set=ps),
                               np.full(2, sum(ranks) / 2))  # Average divides by the set's size
    for _ in range(3):  # cached signatures per set
        x = np.full(5, 1.0)
        hvd.allreduce_(x, name="ps.inplace", op=hvd.Sum, process_set=ps)
        np.testing.assert_array_equal(x, np.full(5, 2.0))
    root = max(ranks)  # a global rank, as in Horovod
    np.testing.assert_array_equal(hvd.broadcast(np.array([me, me]), root, name="ps.b", process_set=ps), [root, root])
    np.testing.assert_array_equal(hvd.allgather(np.array([me]), name="ps.g", process_set=ps), ranks)
    assert hvd.allgather_object(me, process_set=ps) == ranks
    assert hvd.broadcast_object({"from": me}, root_rank=min(ranks), process_set=ps) == {"from": min(ranks)}
    handles = [hvd.allreduce_async(np.full(2, float(i)), name=f"ps.a{i}", op=hvd.Sum, process_set=ps)
               for i in range(10)]
    for i, h in enumerate(handles):
        np.testing.assert_array_equal(hvd.synchronize(h), np.full(2, 2.0 * i))
    outs = hvd.grouped_allreduce([np.ones(2), np.ones(3)], name="ps.grp", op=hvd.Sum, process_set=ps)
    assert [o.tolist() for o in outs] == [[2.0, 2.0], [2.0, 2.0, 2.0]]
    hvd.barrier(process_set=ps)
    # unnamed ops: a different number on each set, then an unnamed global op still matches
    for _ in range(1 + me % 2):
        hvd.allreduce(np.ones(1), process_set=ps)
    np.testing.assert_array_equal(hvd.allreduce(np.ones(1), op=hvd.Sum), [4.0])


@case
def misuse_is_a_clear_error():
    me = hvd.rank()
    ps, ranks = mine()
    other = SETS["odd"] if ps is SETS["even"] else SETS["even"]
    expect(ValueError, lambda: hvd.allreduce(np.ones(1), process_set=other), f"rank {me} is not in process set",
           str(other.ranks))
    expect(ValueError, lambda: hvd.allreduce(np.ones(1), process_set=hvd.ProcessSet([0, 1])), "not a registered")
    outsider = [r for r in range(4) if r not in ranks][0]
    expect(ValueError, lambda: hvd.broadcast(np.ones(1), outsider, process_set=ps), f"root_rank {outsider}",
           "not in process set")
    expect(ValueError, lambda: hvd.add_process_set([0, 2]), "exists already")
    expect(ValueError, lambda: hvd.add_process_set([0, 9]), "subset of 0..3")
    expect(ValueError, lambda: hvd.ProcessSet([1, 1]), "distinct")
    expect(ValueError, lambda: hvd.add_process_set([0, 1 + me % 2]), "ranks disagree")  # checked on every rank
    hvd.barrier()


@case
def remove_and_add_again():
    even = SETS["even"]
    old_id = even.process_set_id
    assert hvd.remove_process_set(even) is True and even.process_set_id is None
    assert hvd.remove_process_set(hvd.global_process_set) is False
    if hvd.rank() % 2 == 0:
        expect(ValueError, lambda: hvd.allreduce(np.ones(1), process_set=even), "not a registered")
    again = hvd.add_process_set([0, 2])
    assert again.process_set_id not in (None, old_id)
    SETS["even"] = again
    ps, ranks = mine()
    np.testing.assert_array_equal(hvd.allreduce(np.ones(1), name="again", op=hvd.Sum, process_set=ps), [2.0])


@case
def torch_distributed_optimizer_per_set():
    ps, ranks = mine()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters(), process_set=ps)
    thvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(100 + hvd.rank())  # every rank its own data
    for _ in range(3):
        x, y = torch.randn(8, 4, generator=gen), torch.randn(8, 1, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
    everyone = hvd.allgather_object(flat)
    assert all(everyone[r] == flat for r in ranks), "ranks of one set differ"
    others = [r for r in range(4) if r not in ranks]
    assert all(everyone[r] != flat for r in others), "the two sets were averaged together"
    t = thvd.allreduce(torch.full((2,), float(hvd.rank()), requires_grad=True), op=thvd.Sum, process_set=ps)
    t.sum().backward()  # the gradient's allreduce runs on the same set
    assert t.tolist() == [float(sum(ranks))] * 2


@case
def init_with_process_sets():
    hvd.shutdown()
    assert SETS["even"].process_set_id is None  # shutdown forgets the sets
    hvd.init(process_sets=[[0, 1, 2], hvd.ProcessSet([3])])
    first, last = hvd.process_sets()[1:]
    assert (first.ranks, last.ranks) == ([0, 1, 2], [3])
    ps = first if hvd.rank() < 3 else last
    np.testing.assert_array_equal(hvd.allreduce(np.ones(1), op=hvd.Sum, process_set=ps), [float(ps.size())])


if __name__ == "__main__":
    main(hvd)
