"""Horovod 0.28.1's documented TensorFlow behaviour, case by case (run by tests/tensorflow/test_horovod_tf.py
on 2, 3 and 4 ranks): the error types programs catch, alltoall's return value, gradients, Horovod's public
names, IndexedSlices in groups. Each case runs eagerly, in tf.function and in a TF1 graph where the API
allows."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "runtime", "workers"))
import tensorflow as tf  # noqa: E402
import trainrun.tensorflow as hvd  # noqa: E402
from harness import case, expect, main  # noqa: E402


def modes():
    """(mode name, run) pairs: run(fn) calls fn() eagerly, in a tf.function, or builds it in a TF1 graph
    and runs it in a session (fn builds the same ops on every rank)."""
    def graph(fn):
        with tf.Graph().as_default():
            out = fn()
            with tf.compat.v1.Session() as sess:
                return sess.run(out)
    return [("eager", lambda fn: fn()), ("tf.function", lambda fn: tf.function(fn)()), ("graph", graph)]


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol)


# ---- 1. error types ----------------------------------------------------------------------------
@case
def mismatches_raise_failed_precondition():
    """Shape, dtype and root rank that differ between ranks: tf.errors.FailedPreconditionError with
    trainrun's message, eagerly, in tf.function and in TF1 graphs; still a HorovodInternalError."""
    r = hvd.rank()
    for mode, run in modes():
        for what, fn in (("shape", lambda: hvd.allreduce(tf.ones([2 + r]), name=f"shape.{mode}")),
                         ("dtype", lambda: hvd.allgather(tf.ones([2], tf.float32 if r else tf.float64),
                                                         name=f"dtype.{mode}")),
                         ("root_rank", lambda: hvd.broadcast(tf.ones([2]), root_rank=min(r, 1), name=f"root.{mode}"))):
            msg = expect(tf.errors.FailedPreconditionError, lambda: run(fn), f"Mismatched {what}")
            assert "UnknownError" not in msg, (mode, msg)
    # eagerly it is also trainrun's own type (elastic programs catch HorovodInternalError)
    expect(hvd.HorovodInternalError, lambda: hvd.allreduce(tf.ones([1 + r]), name="shape2"), "Mismatched shape")


@case
def bad_arguments_raise_invalid_argument():
    """alltoall splits that do not add up, and a first dimension not divisible by the size without
    splits: tf.errors.InvalidArgumentError (still a ValueError) with trainrun's message."""
    n = hvd.size()
    for mode, run in modes():
        expect(tf.errors.InvalidArgumentError, lambda: run(lambda: hvd.alltoall(tf.ones([4]), splits=[1] * (n - 1) + [2])),
               "splits")
        expect(tf.errors.InvalidArgumentError, lambda: run(lambda: hvd.alltoall(tf.ones([n + 1]))), "divisible")
    expect(ValueError, lambda: hvd.alltoall(tf.ones([n + 1])), "divisible")  # eagerly also a ValueError


@case
def a_tensor_one_rank_never_submits_raises_failed_precondition():
    """Rank 0 submits a tensor the others never do (they submit another): after the stall timeout,
    FailedPreconditionError on every rank, eagerly and in tf.function."""
    for mode, run in modes()[:2]:
        name = f"only.{hvd.rank() == 0}.{mode}"
        expect(tf.errors.FailedPreconditionError, lambda: run(lambda: hvd.allreduce(tf.ones([2]), name=name)), "only.")


if __name__ == "__main__":
    main(hvd)
