"""Horovod's Keras callbacks (horovod.keras.callbacks) for Keras 3 on the torch backend."""
from __future__ import annotations

import keras
import numpy as np

from trainrun.keras.ops import broadcast_variables
from trainrun.runtime import state
from trainrun.torch import mpi_ops


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of training, give every rank `root_rank`'s model and optimizer variables, so
    that ranks initialized differently (or only rank 0 restored from a checkpoint) start alike."""

    def __init__(self, root_rank: int = 0, device: str = ""):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        broadcast_variables(self.model.variables, self.root_rank, prefix="keras.model")
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and optimizer.built:
            broadcast_variables(optimizer.variables, self.root_rank, prefix="keras.optimizer")
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of every epoch, replace each metric in `logs` by its average over ranks (so the
    history and later callbacks -- checkpointing, early stopping -- see the same numbers everywhere).
    Must come before the callbacks that read the metrics."""

    def on_epoch_end(self, epoch, logs=None):
        if not logs or state.size() == 1:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        averaged = mpi_ops.allreduce(keras.ops.convert_to_tensor(values), name="keras.metrics." + ".".join(keys))
        for k, v in zip(keys, averaged.tolist()):
            logs[k] = v


class LearningRateWarmupCallback(keras.callbacks.Callback):
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
        n = state.size()
        return 1.0 / n * (epoch * (n - 1) / self.warmup_epochs + 1)

    def on_train_batch_begin(self, batch, logs=None):
        if self._epoch >= self.warmup_epochs:
            return
        epoch = self._epoch + (batch + 1) / self.steps_per_epoch
        self.model.optimizer.learning_rate.assign(self.initial_lr * self.multiplier(min(epoch, self.warmup_epochs)))

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.warmup_epochs and self.verbose and state.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {self.initial_lr:g}.")
