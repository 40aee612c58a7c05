"""The MPI world's room in /dev/shm (mpiworld/shm.py): the measured need and the line naming a host short of it."""
from trainrun.mpiworld.shm import SHM_BASE_BYTES, SHM_PER_RANK_BYTES, shm_need, shm_shortage

MIB = 1 << 20


def test_need_is_the_measured_segment():
    # MPICH 5.0.2's segment for 1, 2, 4 and 8 local ranks, as measured (the constants' comment)
    assert [shm_need(n) for n in (1, 2, 4, 8)] == [1_061_440, 2_118_784, 4_233_472, 8_462_848]
    assert shm_need(0) == 0
    assert SHM_BASE_BYTES + SHM_PER_RANK_BYTES == 1_061_440


def test_shortage_names_host_free_and_need():
    line = shm_shortage("h4", 2 * MIB, 2)
    assert line is not None and line.startswith("h4: /dev/shm has 2 MiB free, the MPI world needs 2.1 MiB for its 2 rank(s) there (")


def test_free_and_need_never_print_equal():
    """Free rounds down, need rounds up: a byte short of 1.01 MiB reads 1 MiB free against 1.1 needed."""
    line = shm_shortage("h", shm_need(1) - 1, 1)
    assert line is not None and "has 1 MiB free, the MPI world needs 1.1 MiB" in line


def test_enough_or_unknown_passes():
    assert shm_shortage("h", shm_need(3), 3) is None
    assert shm_shortage("h", None, 8) is None  # an agent that does not report it: never fail on a guess
    assert shm_shortage("h", 0, 0) is None
