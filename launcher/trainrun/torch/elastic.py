"""`hvd.elastic` for PyTorch: Horovod's elastic API (trainrun.elastic.state) plus TorchState.

    @hvd.elastic.run
    def train(state):
        for state.batch in range(state.batch, batches):
            ...
            if state.batch % k == 0:
                state.commit()

    state = hvd.elastic.TorchState(model, optimizer, batch=0)
    state.register_reset_callbacks([lambda: rescale_lr(hvd.size())])
    train(state)
"""
from __future__ import annotations

import io

import torch

from trainrun.elastic.state import HostsUpdatedInterrupt, ObjectState, State, restart_count, run
from trainrun.runtime.exceptions import HorovodInternalError

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState", "restart_count", "run"]


class TorchState(ObjectState):
    """A model's and an optimizer's state_dicts plus plain values (`**kwargs`, as ObjectState), committed and
    synced together as one torch.save blob."""

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        super().__init__(**kwargs)

    def serialize(self) -> bytes:
        buf = io.BytesIO()
        torch.save({
            "model": self.model.state_dict() if self.model is not None else None,
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "objects": {n: getattr(self, n) for n in self._names},
        }, buf)
        return buf.getvalue()

    def deserialize(self, data: bytes) -> None:
        doc = torch.load(io.BytesIO(data), weights_only=False)  # our own blob: plain values included
        if self.model is not None:
            self.model.load_state_dict(doc["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(doc["optimizer"])
        for name, value in doc["objects"].items():
            setattr(self, name, value)
