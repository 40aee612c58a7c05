import pytest

from trainrun.errors import UsageError
from trainrun.plan.hosts import HostSpec
from trainrun.plan.placement import assign_ranks, gpus_for, ranks_per_host

H = HostSpec


@pytest.mark.parametrize("slots, np, over, counts", [
    ([4], 4, False, [4]),
    ([2, 2], 3, False, [2, 1]),
    ([2, 2, 2], 2, False, [2, 0, 0]),
    ([1, 1], 5, True, [3, 2]),
    ([2, 1], 5, True, [3, 2]),
])
def test_ranks_per_host(slots, np, over, counts):
    hosts = [H(f"h{i}", s) for i, s in enumerate(slots)]
    assert ranks_per_host(hosts, np, over) == counts


def test_too_many_ranks_names_both_numbers():
    with pytest.raises(UsageError, match=r"-np 5 is more than the 4 slot\(s\).*--oversubscribe"):
        ranks_per_host([H("a", 2), H("b", 2)], 5)


def table(assignments):
    return [(a.rank, a.host.name, a.local_rank, a.local_size, a.cross_rank, a.cross_size, a.node_rank, a.nnodes) for a in assignments]


def test_assignments_three_hosts_uneven():
    # rank, host, local, local_size, cross, cross_size, node, nnodes
    assert table(assign_ranks([H("a", 2), H("b", 2), H("c", 2)], 5)) == [
        (0, "a", 0, 2, 0, 3, 0, 3),
        (1, "a", 1, 2, 0, 2, 0, 3),
        (2, "b", 0, 2, 1, 3, 1, 3),
        (3, "b", 1, 2, 1, 2, 1, 3),
        (4, "c", 0, 1, 2, 3, 2, 3),
    ]


def test_unused_hosts_are_not_nodes():
    a = assign_ranks([H("a", 4), H("b", 4)], 2)
    assert {x.nnodes for x in a} == {1} and {x.host.name for x in a} == {"a"}


@pytest.mark.parametrize("local_rank, local_size, pool, k, share, expected", [
    (0, 2, (0, 1), 1, False, (0,)),
    (1, 2, (0, 1), 1, False, (1,)),
    (1, 2, (0, 1, 2, 3), 2, False, (2, 3)),
    (1, 2, (5, 7), 1, False, (7,)),
    (2, 3, (0, 1), 1, True, (0,)),
    (0, 2, (), 1, False, ()),
])
def test_gpus_for(local_rank, local_size, pool, k, share, expected):
    assert gpus_for(local_rank, local_size, pool, k, share, "h") == expected


def test_gpu_oversharing_is_an_error():
    with pytest.raises(UsageError, match="host h: 3 local rank.*need 3 GPUs but it has 2.*--allow-gpu-sharing"):
        gpus_for(0, 3, (0, 1), 1, False, "h")


def test_assign_gpus_per_host():
    a = assign_ranks([H("a", 2), H("b", 1)], 3, gpu_pools={"a": (0, 1), "b": (3,)})
    assert [x.gpus for x in a] == [(0,), (1,), (3,)]


def test_gpu_shortage_without_gpus_per_proc_shares_round_robin():
    """A job that does not ask for GPUs (a CPU job on a GPU host) is not refused: ranks share the GPUs."""
    assert [gpus_for(r, 3, (0, 1), 1, False, "h", isolate=False) for r in range(3)] == [(0,), (1,), (0,)]
    with pytest.raises(UsageError, match="--allow-gpu-sharing"):
        gpus_for(2, 3, (0, 1), 1, False, "h", isolate=True)


def test_shares_gpus():
    from trainrun.plan.placement import shares_gpus
    one_each = assign_ranks([H("a", 2), H("b", 2)], 4, gpu_pools={"a": (0, 1), "b": (0, 1)})
    assert not shares_gpus(one_each)  # the same id on two hosts is two GPUs
    shared = assign_ranks([H("a", 2)], 2, gpu_pools={"a": (0,)}, allow_gpu_sharing=True)
    assert [x.gpus for x in shared] == [(0,), (0,)] and shares_gpus(shared)


def test_np_above_the_cap_is_refused_at_once(monkeypatch):
    """Before: -np 10**9 --oversubscribe was handed out one rank at a time (and then planned)."""
    from trainrun.plan.limits import MAX_RANKS

    with pytest.raises(UsageError, match=f"-np 1000000000: a job may have at most {MAX_RANKS} ranks"):
        ranks_per_host([H("a", 1)], 10**9, oversubscribe=True)
    monkeypatch.setenv("TRAINRUN_MAX_RANKS", str(10**9))
    assert ranks_per_host([H("a", 1), H("b", 2)], 10**9, oversubscribe=True) == [500000000, 500000000]


@pytest.mark.parametrize("slots, np", [([3, 1, 2, 5, 2], 13), ([1] * 7, 7), ([4, 4], 13), ([2, 5, 1], 20)])
def test_cross_coords_match_the_definition(slots, np):
    """assign_ranks counts cross ranks in one pass; they must equal cross_coords' definition."""
    from trainrun.plan.placement import cross_coords

    out = assign_ranks([H(f"h{i}", s) for i, s in enumerate(slots)], np, oversubscribe=True)
    counts = [c for c in ranks_per_host([H(f"h{i}", s) for i, s in enumerate(slots)], np, True) if c]
    assert [(a.cross_rank, a.cross_size) for a in out] == [cross_coords(counts, a.node_rank, a.local_rank) for a in out]
