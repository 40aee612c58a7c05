"""Mismatch, stall and misuse errors (run by tests/runtime/test_errors.py with TRAINRUN_STALL_TIMEOUT=1)."""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import trainrun.runtime as hvd  # noqa: E402
from harness import case, expect, main  # noqa: E402


@case
def shape_mismatch():
    shape = (4,) if hvd.rank() == 0 else (5,)
    msg = expect(hvd.TensorMismatchError, lambda: hvd.allreduce(np.ones(shape), name="grad.w"),
                 "grad.w", "shape", "(4,)", "(5,)")
    assert "rank 0" in msg and "rank 1" in msg


@case
def dtype_op_root_kind_mismatch():
    me = hvd.rank()
    expect(hvd.TensorMismatchError, lambda: hvd.allreduce(np.ones(3, np.float32 if me else np.float64), name="d"),
           "'d'", "dtype", "float32", "float64")
    expect(hvd.TensorMismatchError, lambda: hvd.allreduce(np.ones(3), name="o", op=hvd.Sum if me else hvd.Max),
           "'o'", "reduce op", "Sum", "Max")
    expect(hvd.TensorMismatchError, lambda: hvd.broadcast(np.ones(3), root_rank=me, name="b"), "'b'", "root_rank")
    call = (lambda: hvd.allgather(np.ones(3), name="k")) if me else (lambda: hvd.allreduce(np.ones(3), name="k"))
    expect(hvd.TensorMismatchError, call, "'k'", "operation", "allgather", "allreduce")
    expect(hvd.TensorMismatchError, lambda: hvd.allgather(np.ones((2, 2 + me)), name="g"), "'g'", "shape")


@case
def mismatch_after_the_signature_was_cached():
    for _ in range(3):
        hvd.allreduce(np.ones(4), name="cached.w")
    shape = (4,) if hvd.rank() == 0 else (5,)
    expect(hvd.TensorMismatchError, lambda: hvd.allreduce(np.ones(shape), name="cached.w"), "cached.w", "shape")
    for _ in range(2):
        hvd.grouped_allreduce([np.ones(2), np.ones(3)], name="cached.g")
    shapes = [(2,), (3,)] if hvd.rank() == 0 else [(2,), (4,)]
    expect(hvd.TensorMismatchError, lambda: hvd.grouped_allreduce([np.ones(s) for s in shapes], name="cached.g"),
           "cached.g", "shape")
    np.testing.assert_array_equal(hvd.allreduce(np.ones(4), name="cached.w", op=hvd.Sum), np.full(4, hvd.size()))


@case
def still_works_after_errors():
    np.testing.assert_array_equal(hvd.allreduce(np.ones(3), op=hvd.Sum), np.full(3, hvd.size()))


@case
def stall_names_missing_rank_and_tensor():
    if hvd.rank() == 0:
        t0 = time.monotonic()
        h = hvd.allreduce_async(np.ones(2), name="only.on.rank0")
        msg = expect(hvd.StallError, lambda: hvd.synchronize(h), "only.on.rank0", "rank 1", "TRAINRUN_STALL_TIMEOUT")
        assert 1.0 <= time.monotonic() - t0 < 2.0, msg
        time.sleep(2.2 - (time.monotonic() - t0))  # rank 1 is back by then
    else:
        time.sleep(2.0)  # "stops participating" for longer than the stall timeout
    hvd.barrier()
    np.testing.assert_array_equal(hvd.allreduce(np.ones(1), op=hvd.Sum), [hvd.size()])


@case
def stall_of_a_cached_op_names_missing_rank():
    """An op whose signature is cached (agreed by bitmask, not announced) that one rank never issues
    is still reported with the missing rank, within the stall timeout plus a tick (test_errors
    sets 1 s: a quarter-second tick)."""
    for _ in range(2):
        hvd.allreduce(np.ones(2), name="cached.stall")
    if hvd.rank() == 0:
        t0 = time.monotonic()
        h = hvd.allreduce_async(np.ones(2), name="cached.stall")
        msg = expect(hvd.StallError, lambda: hvd.synchronize(h), "cached.stall", "rank 1")
        assert 1.0 <= time.monotonic() - t0 < 2.5, msg
        time.sleep(3.0 - (time.monotonic() - t0))
    else:
        time.sleep(3.0)
    hvd.barrier()
    np.testing.assert_array_equal(hvd.allreduce(np.ones(2), name="cached.stall", op=hvd.Sum), np.full(2, hvd.size()))


@case
def duplicate_name_in_flight():
    h = hvd.allreduce_async(np.ones(2), name="dup")
    expect(ValueError, lambda: hvd.allreduce_async(np.ones(2), name="dup"), "dup")
    hvd.synchronize(h)


if __name__ == "__main__":
    main(hvd)
