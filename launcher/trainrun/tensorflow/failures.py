"""The TensorFlow error types Horovod's ops raise, for trainrun's failures, with trainrun's message.

horovod.tensorflow raises tf.errors.FailedPreconditionError when ranks disagree about a collective
(shape, dtype, root rank, a tensor some rank never submits) and tf.errors.InvalidArgumentError for a
bad argument (alltoall splits that do not add up, a first dimension not divisible by the size). The
classes here are those TF types and also trainrun's own (TensorMismatchError, StallError,
ValueError), so `except tf.errors.FailedPreconditionError` and `except HorovodInternalError` (elastic
training) both keep working. Eagerly they are raised as such; in graphs the collective's node hands
back (code, message) and the TrainrunCheck kernel (native/) fails the step with that code.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from trainrun.runtime.exceptions import StallError, TensorMismatchError

OK = 0
INVALID_ARGUMENT = 3   # absl::StatusCode values, as TrainrunCheck takes them
FAILED_PRECONDITION = 9


class MismatchError(tf.errors.FailedPreconditionError, TensorMismatchError):
    """Ranks submitted one collective with different shapes, dtypes, ops or roots."""

    def __init__(self, message: str):
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


class StalledError(tf.errors.FailedPreconditionError, StallError):
    """Some ranks submitted a collective that others never did."""

    def __init__(self, message: str):
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


class BadArgumentError(tf.errors.InvalidArgumentError, ValueError):
    """An argument no rank could run (bad splits, a root outside the set, an indivisible dimension)."""

    def __init__(self, message: str):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


_BY_TYPE = ((TensorMismatchError, MismatchError, FAILED_PRECONDITION), (StallError, StalledError, FAILED_PRECONDITION),
            (ValueError, BadArgumentError, INVALID_ARGUMENT))
CAUGHT = tuple(t for t, _, _ in _BY_TYPE)


def as_tf_error(e: Exception) -> Exception:
    """`e` (one of CAUGHT) as the TF error type Horovod raises for it; already-translated errors as they are."""
    if isinstance(e, tf.errors.OpError):
        return e
    for base, cls, _ in _BY_TYPE:
        if isinstance(e, base):
            return cls(str(e))
    return e


def code_of(e: Exception) -> tuple[np.int32, np.bytes_]:
    """(TF error code, message) of `e` (one of CAUGHT), as a graph node hands them to TrainrunCheck."""
    for base, _, code in _BY_TYPE:
        if isinstance(e, base):
            return np.int32(code), np.bytes_(str(e).encode())
    raise e


def raising(fn):
    """`fn` raising Horovod's TF error types for trainrun's failures (eagerly; graph nodes report theirs
    through TrainrunCheck)."""
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except CAUGHT as e:
            raise as_tf_error(e) from None
    wrapper.__name__, wrapper.__qualname__, wrapper.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    wrapper.__module__ = fn.__module__
    # no __wrapped__: autograph would convert `fn`'s source and call it with the wrapper's arguments; the
    # ops are plain Python that builds graph nodes, so autograph leaves them alone
    return tf.autograph.experimental.do_not_convert(wrapper)
