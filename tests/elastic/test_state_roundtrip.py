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


def test_tensors_packed_again_are_read_again_when_they_changed_under_the_same_object():
    """The packer reuses a tensor's view from the last commit while its memory, shape and dtype are unchanged
    (TorchState commits the model's own parameters each time); any of them replaced must be packed anew."""
    torch = pytest.importorskip("torch")
    packer = packing.Packer()
    p = torch.nn.Parameter(torch.arange(6.0))
    t = torch.zeros(4)
    state = {"p": p, "t": t, "tied": p}

    def round_trip():
        return packing.unpack(packer.pack(state).to_array())

    first = round_trip()
    assert type(first["p"]) is torch.nn.Parameter and first["p"].requires_grad  # a Parameter comes back as one
    assert first["tied"] is first["p"]  # one object, laid out once
    with torch.no_grad():
        p.add_(1)  # in place: same memory, new values
    t.fill_(2)
    again = round_trip()
    assert torch.equal(again["p"], torch.arange(6.0) + 1) and torch.equal(again["t"], torch.full((4,), 2.0))
    p.data = torch.arange(10.0)  # new memory and shape under the same Parameter
    assert torch.equal(round_trip()["p"], torch.arange(10.0))
    p.requires_grad_(False)
    p.data = torch.ones(2, 5)  # a Parameter without grad takes numpy()'s path
    got = round_trip()["p"]
    assert type(got) is torch.nn.Parameter and not got.requires_grad and torch.equal(got, torch.ones(2, 5))
    p.data = p.data.view(torch.int32)  # same memory and shape, another dtype
    got = round_trip()["p"]
    assert got.dtype == torch.int32 and torch.equal(got, torch.ones(2, 5).view(torch.int32))


def test_an_ordered_dict_comes_back_with_its_order_and_attributes():
    """A state_dict is an OrderedDict with a `_metadata` attribute (module versions, which load_state_dict
    reads); the packer writes OrderedDicts through its own reducer."""
    from collections import OrderedDict

    od = OrderedDict([("b", np.arange(3)), ("a", 1)])
    od._metadata = OrderedDict([("", {"version": 2})])
    plain = OrderedDict(x=1)
    got = packing.unpack(packing.pack({"sd": od, "plain": plain, "again": od}).to_array())
    assert type(got["sd"]) is OrderedDict and list(got["sd"]) == ["b", "a"]
    assert (got["sd"]["b"] == np.arange(3)).all() and got["sd"]["a"] == 1
    assert got["sd"]._metadata == {"": {"version": 2}} and type(got["sd"]._metadata) is OrderedDict
    assert got["again"] is got["sd"] and got["plain"] == OrderedDict(x=1) and not vars(got["plain"])
    od["self"] = od  # a cycle through it
    back = packing.unpack(packing.pack(od).to_array())
    assert back["self"] is back and list(back) == ["b", "a", "self"]
