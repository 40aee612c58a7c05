"""`hvd.elastic` for TensorFlow (`trainrun.tensorflow.elastic`, `trainrun.tensorflow.keras.elastic`): Horovod's
elastic API (trainrun.elastic.state) plus TensorFlowKerasState, TensorFlowState and the Keras callbacks that
keep a state's epoch and batch and commit it during `fit`.

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        model.fit(..., initial_epoch=state.epoch, callbacks=[hvd.elastic.UpdateEpochStateCallback(state),
                                                             hvd.elastic.CommitStateCallback(state)])

Variables are handed over as NumPy arrays, which a commit copies as raw bytes (trainrun.elastic.packing), so a
state committed by one attempt loads in the next one's fresh process. An optimizer that has not made its
variables yet (a new process before its first step) is built on the model's trainable variables first.
"""
from __future__ import annotations

import tensorflow as tf

from trainrun.elastic.state import HostsUpdatedInterrupt, ObjectState, State, restart_count, run
from trainrun.runtime.exceptions import HorovodInternalError

__all__ = ["CommitStateCallback", "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State",
           "TensorFlowKerasState", "TensorFlowState", "UpdateBatchStateCallback", "UpdateEpochStateCallback",
           "restart_count", "run"]


def _optimizer_variables(optimizer) -> list:
    v = optimizer.variables
    return list(v() if callable(v) else v)  # a method on tf-keras's legacy optimizers, a list on Keras 3


class TensorFlowState(ObjectState):
    """`variables` (tf.Variable list, default: the global variables in graph mode) plus plain values."""

    def __init__(self, variables=None, session=None, **kwargs):
        self.variables = list(variables) if variables is not None else tf.compat.v1.global_variables()
        self.session = session
        super().__init__(**kwargs)

    def _values(self) -> list:
        if self.session is not None:
            return self.session.run(self.variables)
        return [v.numpy() for v in self.variables]

    def snapshot(self) -> dict:
        return {"variables": self._values(), "objects": super().snapshot()}

    def load(self, doc: dict) -> None:
        for var, value in zip(self.variables, doc["variables"]):
            if self.session is not None:
                var.load(value, self.session)
            else:
                var.assign(value)
        super().load(doc["objects"])


class TensorFlowKerasState(ObjectState):
    """A Keras model's weights and its optimizer's variables (default: the model's compiled optimizer), plus
    plain values (`**kwargs`, as ObjectState)."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        super().__init__(**kwargs)

    def snapshot(self) -> dict:
        opt = [v.numpy() for v in _optimizer_variables(self.optimizer)] if self.optimizer is not None else []
        return {"model": self.model.get_weights(), "optimizer": opt, "objects": super().snapshot()}

    def load(self, doc: dict) -> None:
        self.model.set_weights(doc["model"])
        if self.optimizer is not None and doc["optimizer"]:
            if len(_optimizer_variables(self.optimizer)) != len(doc["optimizer"]):
                self.optimizer.build(self.model.trainable_variables)  # a fresh process: no slots yet
            for var, value in zip(_optimizer_variables(self.optimizer), doc["optimizer"]):
                var.assign(value)
        super().load(doc["objects"])


class CommitStateCallback(tf.keras.callbacks.Callback):
    """Commit `state` every `batches_per_commit` batches (and at each epoch's end)."""

    def __init__(self, state: State, batches_per_commit: int = 1):
        super().__init__()
        self.state, self.batches_per_commit, self._batches = state, batches_per_commit, 0

    def on_batch_end(self, batch, logs=None):
        self._batches += 1
        if self._batches % self.batches_per_commit == 0:
            self.state.commit()

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(tf.keras.callbacks.Callback):
    """Keep `state.batch` at the batches done in this epoch (0 again at an epoch's end)."""

    def __init__(self, state: State):
        super().__init__()
        self.state = state

    def on_batch_end(self, batch, logs=None):
        self.state.batch = batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(tf.keras.callbacks.Callback):
    """Keep `state.epoch` at the epochs done (pass it to fit's `initial_epoch` after a restart)."""

    def __init__(self, state: State):
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = epoch + 1
