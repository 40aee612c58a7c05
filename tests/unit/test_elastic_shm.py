"""The committed-state segment (wire/shm_slot.py) and the raw-bytes packing (elastic/packing.py): pure
file and buffer logic in a temporary directory (a real mmap of a real file; no ranks)."""
import struct

import numpy as np
import pytest

from trainrun.elastic import packing
from trainrun.wire import shm_slot
from trainrun.elasticjob.control import SegmentStore


def roundtrip(obj):
    return packing.unpack(packing.pack(obj).to_array())


def test_numpy_arrays_go_raw_and_come_back_equal_and_owned():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    f = np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3))
    odd = np.arange(10)[::2]                       # not contiguous: pickled
    obj = {"a": a, "f": f, "odd": odd, "z": np.zeros((0, 3)), "s": np.float64(2.5), "o": np.array([1, "x"], dtype=object),
           "nested": [a, (1, "two")], "rec": np.zeros(2, dtype=[("x", "<i4"), ("y", "<f8")])}
    packed = packing.pack(obj)
    assert len(packed.arrays) == 4                 # a (met twice, laid out once), f, z, rec; odd and the object array are pickled
    assert len(packed.index) < 1000                # the index holds no array bytes
    back = packing.unpack(packed.to_array())
    for k in ("a", "f", "odd", "z", "o", "rec"):
        assert back[k].dtype == obj[k].dtype and back[k].shape == obj[k].shape and (back[k] == obj[k]).all(), k
    assert back["f"].flags.f_contiguous and back["s"] == 2.5 and back["nested"][1] == (1, "two")
    assert back["nested"][0] is back["a"]          # one array in the state, one after unpacking
    buf = packed.to_array()
    out = packing.unpack(buf)
    buf[:] = 0                                     # the result owns its memory
    assert (out["a"] == a).all()


def test_torch_tensors_go_raw_with_dtype_shape_and_grad():
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(5, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 5)).sum().backward()
    opt.step()
    obj = {"model": model.state_dict(), "opt": opt.state_dict(), "bf": torch.arange(4, dtype=torch.bfloat16),
           "g": torch.ones(2, requires_grad=True), "scalar": torch.tensor(3), "t": torch.randn(3, 4).t()}
    packed = packing.pack(obj)
    assert len(packed.arrays) == 2 + 6 + 3         # weight, bias; step, exp_avg(_sq) x 2; bf, g, scalar (t: a view, pickled)
    back = packing.unpack(packed.to_array())
    for k, v in obj["model"].items():
        assert torch.equal(back["model"][k], v)
    assert back["bf"].dtype == torch.bfloat16 and torch.equal(back["bf"], obj["bf"])
    assert back["g"].requires_grad and back["scalar"].shape == () and torch.equal(back["t"], obj["t"])
    m2 = torch.nn.Linear(5, 3)
    o2 = torch.optim.Adam(m2.parameters())
    m2.load_state_dict(back["model"])
    o2.load_state_dict(back["opt"])
    assert torch.equal(o2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def _seg(tmp_path, capacity=1 << 16):
    path = str(tmp_path / "seg")
    shm_slot.create(path, capacity)
    return shm_slot.Segment(path)


def test_segment_alternates_slots_and_newest_wins(tmp_path):
    seg = _seg(tmp_path)
    assert seg.newest() is None
    for count in range(1, 5):
        h = seg.write((0, count), packing.pack({"n": count, "a": np.full(100, count)}))
        assert h.seq == count
        slot, newest = seg.newest()
        assert newest.key == (0, count) and slot == (count - 1) % 2
        assert packing.unpack(seg.payload(slot))["n"] == count
    other = shm_slot.Segment(seg.path)             # another process's view: the same file
    assert other.newest()[1].key == (0, 4)


def test_a_writer_stopped_anywhere_before_the_last_header_write_leaves_the_previous_copy(tmp_path):
    seg = _seg(tmp_path)
    seg.write((0, 1), packing.pack({"n": 1}))
    seg.write((0, 2), packing.pack({"n": 2}))     # slot 1 newest; the next write goes to slot 0
    # the writer's steps, cut after each one: done=0, payload, header fields (the last write, done=seq, missing)
    struct.pack_into("<Q", seg.mm, shm_slot.SLOT_AT[0], 0)
    assert seg.newest()[1].key == (0, 2)
    packing.pack({"n": 3}).write_into(seg.payload(0, 4096))
    assert seg.newest()[1].key == (0, 2)
    struct.pack_into("<QqqQ", seg.mm, shm_slot.SLOT_AT[0] + 8, 3, 0, 3, 100)
    assert seg.newest()[1].key == (0, 2) and packing.unpack(seg.payload(seg.newest()[0]))["n"] == 2


def test_a_corrupt_payload_or_header_is_not_used(tmp_path):
    seg = _seg(tmp_path)
    seg.write((0, 1), packing.pack({"n": 1}))
    h = seg.write((0, 2), packing.pack({"n": 2, "a": np.ones(50)}))
    seg.payload(1, h.length)[-1] ^= 0xFF          # a stray write into the newest copy
    assert seg.newest()[1].key == (0, 1)
    assert seg.newest(verify=False)[1].key == (0, 2)  # the headers alone still look fine
    struct.pack_into("<q", seg.mm, shm_slot.SLOT_AT[0] + 16, 7)  # the other copy's key changed under its crc
    assert seg.newest() is None


def test_older_keys_never_win_over_newer_ones(tmp_path):
    seg = _seg(tmp_path)
    seg.write((2, 5), packing.pack(1))
    seg.write((1, 9), packing.pack(2))            # written later, but an earlier attempt's key
    assert seg.newest()[1].key == (2, 5)


def test_a_state_too_big_for_the_slot_is_refused(tmp_path):
    seg = _seg(tmp_path, 4096)
    with pytest.raises(shm_slot.SegmentError):
        seg.write((0, 1), packing.pack(np.zeros(10000)))


def test_crc32_copies_read_back_too(tmp_path, monkeypatch):
    seg = _seg(tmp_path)
    monkeypatch.setattr(shm_slot, "_xxhash", None)
    h = seg.write((0, 1), packing.pack(np.arange(1000)))
    assert h.algorithm == shm_slot.CRC32 and seg.newest()[1].key == (0, 1)


def test_store_grows_keeping_the_newest_copy_and_removes_its_files(tmp_path):
    store = SegmentStore(str(tmp_path))
    store.job_id = "abc123"
    assert store.segment(0) == ""
    p1 = store.segment(1000)
    assert p1.endswith("_abc123_1") and store.segment(500) == p1
    seg = shm_slot.Segment(p1)
    seg.write((0, 7), packing.pack({"w": np.arange(100)}))
    seg.close()
    store.job_id = "def456"
    p2 = store.segment(store.capacity + 1)
    assert p2.endswith("_def456_2") and not (tmp_path / p1.rsplit("/", 1)[1]).exists()
    seg = shm_slot.Segment(p2)
    slot, h = seg.newest()
    assert h.key == (0, 7) and (packing.unpack(seg.payload(slot))["w"] == np.arange(100)).all()
    seg.write((0, 8), packing.pack({"w": 1}))     # goes to slot 1: the moved copy stays until then
    assert seg.newest()[1].key == (0, 8) and seg.header(0).key == (0, 7)
    seg.close()
    store.remove()
    assert list(tmp_path.iterdir()) == []
