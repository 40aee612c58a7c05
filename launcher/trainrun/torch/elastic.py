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

import torch

from trainrun.elastic.state import HostsUpdatedInterrupt, ObjectState, State, restart_count, run
from trainrun.runtime.exceptions import HorovodInternalError

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState", "restart_count", "run"]


class TorchState(ObjectState):
    """A model's and an optimizer's state_dicts plus plain values (`**kwargs`, as ObjectState), committed and
    synced together; their CPU tensors are copied as raw bytes (trainrun.elastic.packing), the rest pickled."""

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        super().__init__(**kwargs)

    def snapshot(self) -> dict:
        return {
            # keep_vars: the parameters themselves, the same objects at every commit (packing.py then
            # reuses their views; state_dict() would detach each afresh). load_state_dict takes either.
            "model": self.model.state_dict(keep_vars=True) if self.model is not None else None,
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "objects": super().snapshot(),
        }

    def load(self, obj: dict) -> None:
        if self.model is not None:
            self.model.load_state_dict(obj["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(obj["optimizer"])
        super().load(obj["objects"])
