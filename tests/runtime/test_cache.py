"""The response cache alone (no MPI): numbering, the lone op's round contribution, the fusion plan."""
import numpy as np

from trainrun.runtime import rounds
from trainrun.runtime.cache import ResponseCache
from trainrun.runtime.ops import GROUP, Average, Request, Sum


def req(name, shape=(4,), dtype="float32", op=Sum, splits=None):
    a = np.zeros(int(np.prod(shape)), dtype=np.float32)
    r = Request("allreduce", name, a, a, shape, dtype, op, splits=splits)
    return r


def test_ids_follow_the_order_ops_ran_and_repeat_signatures_keep_theirs():
    cache = ResponseCache()
    a, b = req("a"), req("b")
    cache.add([a, b])
    cache.add([req("a")])  # the same signature again
    assert cache.ids[a.meta()] == 0 and cache.ids[b.meta()] == 1 and len(cache.metas) == 2
    assert cache.ids.get(req("a", shape=(5,)).meta()) is None  # a changed shape is a new signature
    assert cache.words == rounds.words(2)


def test_capacity_stops_numbering():
    cache = ResponseCache(capacity=3)
    cache.add([req(f"t{i}") for i in range(5)])
    assert len(cache.metas) == 3 and cache.words == rounds.words(3)


def test_solo_contribution_follows_the_round_size():
    cache = ResponseCache()
    cache.add([req("a")])
    assert cache.solo(0) == rounds.encode(0, 1, 2)
    cache.add([req(f"t{i}") for i in range(70)])  # one more word per 64 ids
    assert len(cache.solo(0)) == 16 * rounds.words(71)


def test_batches_fuse_by_key_up_to_the_threshold_and_keep_groups_alone():
    cache = ResponseCache()
    cache.add([req("a"), req("b"), req("c", op=Average), req("g", shape=((2,), (3,)), splits=GROUP),
               req("d"), req("e", dtype="float64")])
    # 16 bytes each: a threshold of 32 takes two float32 Sum ops per reduction
    assert cache.batches([0, 1, 2, 3, 4, 5], threshold=32) == [[3], [0, 1], [4], [2], [5]]
    assert cache.batches([0, 1, 2, 3, 4, 5], threshold=1 << 20) == [[3], [0, 1, 4], [2], [5]]
    assert cache.batches([4], threshold=0) == [[4]]


def test_plan_is_the_batches_of_a_mask_remembered():
    cache = ResponseCache()
    cache.add([req("a"), req("b"), req("c", op=Average)])
    mask = 0b111
    plan = cache.plan(mask, threshold=1 << 20)
    assert plan == cache.batches([0, 1, 2], 1 << 20) == [[0, 1], [2]]
    assert cache.plan(mask, threshold=1 << 20) is plan  # remembered
    assert cache.plan(mask, threshold=16) == [[0], [1], [2]]  # another threshold, another plan
