"""transfer_tuner.TransferTuner, pure: per size class it measures both ways of waiting, alternated, keeps the
faster (lower median) for EXPLOIT waits, then measures again; sizes are independent."""
from __future__ import annotations

from trainrun.runtime.transfer_tuner import MPI, SLEEP, TransferTuner


def measure(tuner, key, sleep_s, mpi_s, n):
    """Run n waits of size class `key` where the ways take sleep_s and mpi_s; the ways used, in order."""
    used = []
    for _ in range(n):
        way, measuring = tuner.choose(key)
        used.append(way)
        if measuring:
            tuner.record(key, way, sleep_s if way == SLEEP else mpi_s)
    return used


def test_it_alternates_while_measuring_then_keeps_the_faster_way():
    t = TransferTuner(explore=3, exploit=5)
    assert t.best(20) is None
    used = measure(t, 20, sleep_s=0.004, mpi_s=0.002, n=6 + 5)
    assert used == [SLEEP, MPI] * 3 + [MPI] * 5
    assert t.best(20) == MPI


def test_it_measures_again_after_exploit_waits_and_follows_a_change_of_load():
    t = TransferTuner(explore=2, exploit=3)
    first = measure(t, 20, sleep_s=0.004, mpi_s=0.002, n=4 + 3)
    assert first[4:] == [MPI] * 3
    again = measure(t, 20, sleep_s=0.002, mpi_s=0.004, n=4 + 3)   # hogs started: MPI_Wait is now slower
    assert again == [SLEEP, MPI, SLEEP, MPI] + [SLEEP] * 3 and t.best(20) == SLEEP


def test_the_median_decides_so_one_outlier_does_not():
    t = TransferTuner(explore=3, exploit=1)
    for way, s in ((SLEEP, 0.003), (MPI, 0.002), (SLEEP, 0.003), (MPI, 0.5), (SLEEP, 0.003), (MPI, 0.002)):
        assert t.choose(7) == (way, True)
        t.record(7, way, s)
    assert t.best(7) == MPI


def test_a_tie_keeps_the_policys_sleeps():
    t = TransferTuner(explore=1, exploit=1)
    measure(t, 5, sleep_s=0.001, mpi_s=0.001, n=2)
    assert t.best(5) == SLEEP


def test_size_classes_are_measured_apart():
    t = TransferTuner(explore=2, exploit=10)
    for _ in range(4):  # two sizes interleaved, as a step's two buckets: each measured on its own
        for key, (sleep_s, mpi_s) in ((10, (0.001, 0.002)), (20, (0.004, 0.002))):
            way, measuring = t.choose(key)
            assert measuring
            t.record(key, way, sleep_s if way == SLEEP else mpi_s)
    assert (t.best(10), t.best(20)) == (SLEEP, MPI)
