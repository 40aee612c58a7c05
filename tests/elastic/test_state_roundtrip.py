"""save()/restore() of the framework states in one process (no launcher: the private copy, the same packing as
a commit's): every array comes back bit for bit, arrays and tensors as raw bytes, not pickles. With ranks and
a restart: test_commit_shm.py (NumPy), test_elastic_example.py (TorchState)."""
import numpy as np
import pytest

from trainrun.elastic import ObjectState, packing


def test_object_state_round_trip_keeps_arrays_and_values():
    s = ObjectState(w=np.arange(10.0), meta={"lr": 0.1, "names": ["a"]}, step=3)
    s.save()
    s.w[:] = 0
    s.meta["lr"], s.step = 9.0, 7
    s.restore()
    assert (s.w == np.arange(10.0)).all() and s.meta == {"lr": 0.1, "names": ["a"]} and s.step == 3
    assert len(packing.pack(s.snapshot()).arrays) == 1


def test_torch_state_round_trip_model_optimizer_and_values():
    torch = pytest.importorskip("torch")
    from trainrun.torch.elastic import TorchState

    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    s = TorchState(model, opt, epoch=1)
    assert len(packing.pack(s.snapshot()).arrays) == 4 + 4 * 3  # parameters; step, exp_avg, exp_avg_sq each
    s.save()
    want = {k: v.clone() for k, v in model.state_dict().items()}
    want_opt = opt.state_dict()["state"][0]["exp_avg"].clone()
    for _ in range(2):
        model(torch.randn(3, 8)).sum().backward()
        opt.step()
    s.epoch = 5
    s.restore()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in want.items())
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], want_opt) and s.epoch == 1
