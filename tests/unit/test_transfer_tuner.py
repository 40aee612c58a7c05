"""transfer_tuner.TransferTuner, pure: per size class it measures the period between transfers with each way
of waiting, in blocks (the first of each block not counted), keeps the better (lower median) for EXPLOIT
transfers, then measures again; sizes are independent."""
from __future__ import annotations

from trainrun.runtime.transfer_tuner import MPI, SLEEP, TransferTuner


def run(tuner, key, sleep_s, mpi_s, n):
    """n transfers of size class `key` whose period is sleep_s or mpi_s by the way used; the ways, in order."""
    used = []
    for _ in range(n):
        way, measuring = tuner.choose(key)
        used.append(way)
        if measuring:
            tuner.record(key, way, sleep_s if way == SLEEP else mpi_s)
    return used


def test_it_measures_a_block_of_each_way_then_keeps_the_better():
    t = TransferTuner(explore=3, exploit=5)
    assert t.best(20) is None
    used = run(t, 20, sleep_s=0.004, mpi_s=0.002, n=6 + 5)
    assert used == [SLEEP] * 3 + [MPI] * 3 + [MPI] * 5
    assert t.best(20) == MPI


def test_a_blocks_first_period_is_not_counted():
    t = TransferTuner(explore=2, exploit=1)
    # each block's first period followed the other way's transfer: a huge one there must not decide
    for way, s in ((SLEEP, 9.0), (SLEEP, 0.001), (MPI, 0.0001), (MPI, 0.002)):
        assert t.choose(4) == (way, True)
        t.record(4, way, s)
    assert t.best(4) == SLEEP


def test_no_previous_transfer_is_not_counted():
    t = TransferTuner(explore=2, exploit=1)
    for way, s in ((SLEEP, None), (SLEEP, 0.003), (MPI, None), (MPI, 0.001)):
        assert t.choose(4) == (way, True)
        t.record(4, way, s)
    assert t.best(4) == MPI


def test_it_measures_again_after_exploit_transfers_and_follows_a_change_of_load():
    t = TransferTuner(explore=2, exploit=3)
    first = run(t, 20, sleep_s=0.004, mpi_s=0.002, n=4 + 3)
    assert first[4:] == [MPI] * 3
    again = run(t, 20, sleep_s=0.002, mpi_s=0.004, n=4 + 3)   # hogs started: MPI_Wait now costs more
    assert again == [SLEEP, SLEEP, MPI, MPI] + [SLEEP] * 3 and t.best(20) == SLEEP


def test_the_median_decides_so_one_outlier_does_not():
    t = TransferTuner(explore=4, exploit=1)
    for way, s in ((SLEEP, 1), (SLEEP, 0.003), (SLEEP, 0.003), (SLEEP, 0.003),
                   (MPI, 1), (MPI, 0.002), (MPI, 0.5), (MPI, 0.002)):
        assert t.choose(7) == (way, True)
        t.record(7, way, s)
    assert t.best(7) == MPI


def test_a_tie_keeps_the_policys_sleeps():
    t = TransferTuner(explore=2, exploit=1)
    run(t, 5, sleep_s=0.001, mpi_s=0.001, n=4)
    assert t.best(5) == SLEEP


def test_size_classes_are_measured_apart():
    t = TransferTuner(explore=2, exploit=10)
    for _ in range(4):  # two sizes interleaved, as a step's two buckets: each measured on its own
        for key, (sleep_s, mpi_s) in ((10, (0.001, 0.002)), (20, (0.004, 0.002))):
            way, measuring = t.choose(key)
            assert measuring
            t.record(key, way, sleep_s if way == SLEEP else mpi_s)
    assert (t.best(10), t.best(20)) == (SLEEP, MPI)
