"""The agreement round's encoding alone (no MPI): MPI_BAND over every rank's [v, ~v] gives AND and OR."""
import functools

import pytest

from trainrun.runtime import rounds


def band(buffers: list[bytes]) -> bytes:
    """What MPI_Allreduce(op=MPI_BAND) leaves in every rank's receive buffer."""
    return bytes(functools.reduce(lambda a, b: a & b, column) for column in zip(*buffers))


@pytest.mark.parametrize("cache_size", [0, 1, 63, 64, 65, 4096])
def test_and_or_of_flags_and_cached_ops(cache_size):
    n = rounds.words(cache_size)
    assert n == 1 + -(-cache_size // 64)  # the flags word plus one bit per cache entry
    top = max(cache_size - 1, 0)
    contributions = [  # (flags, cache ids ready) per rank
        (0, {0, 5, top}),
        (rounds.NEW, {0, top}),
        (rounds.PHASE, {0, 7, top}),
    ]
    if cache_size == 0:
        contributions = [(f, set()) for f, _ in contributions]
    sent = [rounds.encode(f, sum(1 << c for c in ids), n) for f, ids in contributions]
    assert all(len(s) == 16 * n for s in sent)
    and_v, or_v = rounds.decode(band(sent), n)
    assert and_v & rounds.FLAG_MASK == 0
    assert or_v & rounds.FLAG_MASK == rounds.NEW | rounds.PHASE
    common = set.intersection(*(ids for _, ids in contributions))
    anywhere = set.union(*(ids for _, ids in contributions))
    assert rounds.ids(and_v >> rounds.FLAG_BITS) == sorted(common)
    assert rounds.ids(or_v >> rounds.FLAG_BITS) == sorted(anywhere)


def test_a_lone_op_on_every_rank_reduces_to_what_each_sent():
    """The engine's shortcut (Engine._alone): every rank sent exactly this op and no flags."""
    one = rounds.encode(0, 1 << 9, rounds.words(100))
    assert band([one, one, one]) == one
    other = rounds.encode(0, 1 << 9 | 1 << 3, rounds.words(100))
    assert band([one, other]) != one


def test_ids_are_ascending():
    assert rounds.ids(0) == []
    assert rounds.ids(0b1011_0001) == [0, 4, 5, 7]
    assert rounds.ids(1 << 4095) == [4095]

