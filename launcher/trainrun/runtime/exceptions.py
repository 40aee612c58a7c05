"""Errors raised by collective operations (Horovod's names, so `except HorovodInternalError` keeps working).

Argument errors (bad op, bad root, calling before init) are raised at the call as ValueError, as Horovod
does. Failures agreed on by the ranks (mismatch, stall, shutdown) are raised from `synchronize()` and the
blocking ops as HorovodInternalError subclasses, on every rank that submitted the tensor.
"""
from __future__ import annotations


class HorovodInternalError(RuntimeError):
    """A collective failed; the message names the tensor(s) and why."""


class TensorMismatchError(HorovodInternalError):
    """Ranks submitted the same tensor name with a different operation, dtype, shape, op, root or scale."""


class StallError(HorovodInternalError):
    """Some ranks submitted a tensor and the others did not within TRAINRUN_STALL_TIMEOUT seconds.
    `absent`: the global ranks that did not submit, `names`: the tensors waited on, `seconds`: the
    stall timeout (empty / 0 where not known). A launch ends the job on it (runtime/rankhook.py tells the
    launcher, which names the absent ranks with their stacks): no rank can end that wait from inside."""

    absent: tuple = ()  # (class defaults: a subclass that does not call this __init__ still has them)
    names: tuple = ()
    seconds: float = 0.0

    def __init__(self, message: str = "", *, absent: tuple = (), names: tuple = (), seconds: float = 0.0):
        super().__init__(message)
        self.absent, self.names, self.seconds = tuple(absent), tuple(names), seconds
