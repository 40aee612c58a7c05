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

Keyword values that are a torch Module, an Optimizer or an ElasticSampler (sampler.py) are kept by their
state_dicts, as Horovod's handlers keep them (`TorchState(model, opt, sampler=sampler, disc=d, disc_opt=o)`):
the objects stay the program's own, loaded in place at restore() and sync().
"""
from __future__ import annotations

import torch

from trainrun.elastic.state import HostsUpdatedInterrupt, ObjectState, State, restart_count, run
from trainrun.runtime.exceptions import HorovodInternalError
from trainrun.torch.sampler import ElasticSampler

__all__ = ["ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState",
           "restart_count", "run"]

_BY_STATE_DICT = (torch.nn.Module, torch.optim.Optimizer, ElasticSampler)


class TorchState(ObjectState):
    """A model's and an optimizer's state_dicts plus plain values (`**kwargs`, as ObjectState), committed and
    synced together; their CPU tensors are copied as raw bytes (trainrun.elastic.packing), the rest pickled."""

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        # other Modules, Optimizers and ElasticSamplers among the values: kept by state_dict, loaded in place
        self._by_state_dict = [n for n, v in kwargs.items() if isinstance(v, _BY_STATE_DICT)]
        for name in self._by_state_dict:
            setattr(self, name, kwargs.pop(name))
        super().__init__(**kwargs)

    def snapshot(self) -> dict:
        return {
            # keep_vars: the parameters themselves, the same objects at every commit (packing.py then
            # reuses their views; state_dict() would detach each afresh). load_state_dict takes either.
            "model": self.model.state_dict(keep_vars=True) if self.model is not None else None,
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "handled": {n: _state_dict(getattr(self, n)) for n in self._by_state_dict},
            "objects": super().snapshot(),
        }

    def load(self, obj: dict) -> None:
        if self.model is not None:
            self.model.load_state_dict(obj["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(obj["optimizer"])
        for name, value in obj["handled"].items():
            getattr(self, name).load_state_dict(value)
        super().load(obj["objects"])


def _state_dict(value) -> dict:
    return value.state_dict(keep_vars=True) if isinstance(value, torch.nn.Module) else value.state_dict()
