"""Horovod's Keras callbacks, for any Keras: `make(keras, ops)` builds the classes on that Keras's
`Callback` (Keras 3, or tf-keras) with that backend's collectives (`ops`: a collectives.KerasCollectives)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

import trainrun.runtime as rt
from trainrun.runtime import lifecycle


def _variables(obj) -> list:
    v = getattr(obj, "variables", [])
    return list(v() if callable(v) else v)  # a method on tf-keras's legacy optimizers


class _BroadcastGlobalVariables:
    """At the start of training, give every rank `root_rank`'s model and optimizer variables, so
    that ranks initialized differently (or only rank 0 restored from a checkpoint) start alike.
    An optimizer without variables yet (tf-keras builds them in the first step) is broadcast after
    the first batch instead. `local_variables` (a variable or a collection of them) keep this rank's
    values, as in Horovod."""

    _ops = None

    def __init__(self, root_rank: int = 0, device: str = "", local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False
        self._optimizer_pending = False
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple, set)):
            local_variables = [local_variables]
        self._local = {id(v) for v in local_variables}

    def _shared(self, variables) -> list:
        return [v for v in variables if id(v) not in self._local]

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        self._ops.broadcast_variables(self._shared(self.model.variables), self.root_rank, prefix="keras.model")
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and getattr(optimizer, "built", True) and _variables(optimizer):
            self._ops.broadcast_variables(self._shared(_variables(optimizer)), self.root_rank, prefix="keras.optimizer")
        else:
            self._optimizer_pending = optimizer is not None
        self.broadcast_done = True

    def on_train_batch_end(self, batch, logs=None):
        if self._optimizer_pending:
            self._optimizer_pending = False
            self._ops.broadcast_variables(self._shared(_variables(self.model.optimizer)), self.root_rank,
                                          prefix="keras.optimizer")


class _MetricAverage:
    """At the end of every epoch, replace each metric in `logs` by its average over ranks (so the
    history and later callbacks -- checkpointing, early stopping -- see the same numbers everywhere).
    Must come before the callbacks that read the metrics."""

    def on_epoch_end(self, epoch, logs=None):
        if not logs or lifecycle.size() == 1:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        averaged = rt.allreduce(values, name="keras.metrics." + ".".join(keys))
        for k, v in zip(keys, averaged.tolist()):
            logs[k] = v


class _LearningRateWarmup:
    """Horovod's gradual warm-up (Goyal et al.): over the first `warmup_epochs`, the learning rate
    rises from `initial_lr / size` to `initial_lr`, adjusted every batch as
    lr = initial_lr / size * (epoch' * (size - 1) / warmup_epochs + 1), epoch' = epoch + (batch + 1) / steps_per_epoch.
    `steps_per_epoch` defaults to what `fit` reports. After the warm-up the rate is left alone."""

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0):
        super().__init__()
        self.initial_lr, self.warmup_epochs, self.steps_per_epoch = float(initial_lr), warmup_epochs, steps_per_epoch
        self.verbose = verbose
        self._epoch = 0

    def on_train_begin(self, logs=None):
        if self.steps_per_epoch is None:
            self.steps_per_epoch = self.params.get("steps") if self.params else None
        if not self.steps_per_epoch:
            raise ValueError("LearningRateWarmupCallback needs steps_per_epoch (fit did not report it)")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def multiplier(self, epoch: float) -> float:
        n = lifecycle.size()
        return 1.0 / n * (epoch * (n - 1) / self.warmup_epochs + 1)

    def on_train_batch_begin(self, batch, logs=None):
        if self._epoch >= self.warmup_epochs:
            return
        epoch = self._epoch + (batch + 1) / self.steps_per_epoch
        lr = self.initial_lr * self.multiplier(min(epoch, self.warmup_epochs))
        optimizer = self.model.optimizer
        current = optimizer.learning_rate
        if hasattr(current, "assign"):
            current.assign(lr)
        else:  # a plain float (some tf-keras optimizers before their first step)
            optimizer.learning_rate = lr

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.warmup_epochs and self.verbose and lifecycle.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {self.initial_lr:g}.")


class _LearningRateSchedule:
    """Horovod's LearningRateScheduleCallback: from `start_epoch` until `end_epoch` (exclusive; None: the
    end), lr = initial_lr * multiplier(epoch), `multiplier` a number or a function of the epoch. With
    `staircase` the rate changes at each epoch's start (integer epochs), else every batch (epoch + the
    fraction of it done; `steps_per_epoch` defaults to what `fit` reports). `momentum_correction` is
    accepted (Horovod's applies to TF1 momentum optimizers only)."""

    model: Any  # a mixin of the backend's Callback (made by `cls` below), whose fit sets the model

    def __init__(self, initial_lr: float, multiplier, start_epoch: int = 0, end_epoch: int | None = None,
                 staircase: bool = True, momentum_correction: bool = True, steps_per_epoch: int | None = None,
                 verbose: int = 0):
        super().__init__()
        self.initial_lr, self.start_epoch, self.end_epoch = float(initial_lr), start_epoch, end_epoch
        self.staircase, self.steps_per_epoch, self.verbose = staircase, steps_per_epoch, verbose
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self._epoch = 0

    def _active(self, epoch: float) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set(self, epoch: float) -> None:
        lr = self.initial_lr * self.multiplier(epoch)
        optimizer = self.model.optimizer
        if hasattr(optimizer.learning_rate, "assign"):
            optimizer.learning_rate.assign(lr)
        else:
            optimizer.learning_rate = lr

    def on_train_begin(self, logs=None):
        if not self.staircase and self.steps_per_epoch is None:
            self.steps_per_epoch = self.params.get("steps") if self.params else None
            if not self.steps_per_epoch:
                raise ValueError("LearningRateScheduleCallback(staircase=False) needs steps_per_epoch "
                                 "(fit did not report it)")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        if self.staircase and self._active(epoch):
            self._set(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if not self.staircase:
            epoch = self._epoch + batch / self.steps_per_epoch
            if self._active(epoch):
                self._set(epoch)


def make(keras, ops) -> SimpleNamespace:
    """The callback classes for this Keras and backend."""
    base = keras.callbacks.Callback

    def cls(name, impl, extra=None):
        return type(name, (impl, base), {"__doc__": impl.__doc__, **(extra or {})})
    return SimpleNamespace(
        BroadcastGlobalVariablesCallback=cls("BroadcastGlobalVariablesCallback", _BroadcastGlobalVariables,
                                             {"_ops": ops}),
        MetricAverageCallback=cls("MetricAverageCallback", _MetricAverage),
        LearningRateWarmupCallback=cls("LearningRateWarmupCallback", _LearningRateWarmup),
        LearningRateScheduleCallback=cls("LearningRateScheduleCallback", _LearningRateSchedule))
