"""The control channel (wire/control_protocol.py): a rank's ControlClient against the owner's ControlServer and
SegmentStore, over a real socketpair, the server driven by a selector loop on a thread (as in an agent)."""
import selectors
import threading

import pytest

from trainrun.elastic import packing
from trainrun.wire import shm_slot
from trainrun.elastic.client import ControlClient
from trainrun.elasticjob.control import ControlServer, SegmentStore


@pytest.fixture
def channel(tmp_path):
    store, sel = SegmentStore(str(tmp_path)), selectors.DefaultSelector()
    server = ControlServer(store)
    theirs = server.child_end(0, sel)
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            for key, _ in sel.select(0.05):
                key.data()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    client = ControlClient(theirs.detach())
    yield client, server, store
    stop.set()
    t.join()
    server.release(sel)
    client.sock.close()
    store.remove()


def test_segment_requests_make_grow_and_name_the_file(channel, tmp_path):
    client, _, store = channel
    assert client.segment(0) == ""                  # nothing made yet: nothing is made for a look
    path = client.segment(5 << 20)
    assert path.startswith(str(tmp_path)) and store.path == path and store.capacity >= 5 << 20
    seg = shm_slot.Segment(path)                    # the rank writes it; the owner holds the file
    seg.write((0, 1), packing.pack({"x": 1}))
    seg.close()
    assert client.segment(0) == path and client.segment(1 << 20) == path
    bigger = client.segment(store.capacity + 1)
    assert bigger != path and [p.name for p in tmp_path.iterdir()] == [bigger.rsplit("/", 1)[1]]
    assert shm_slot.Segment(bigger).newest()[1].key == (0, 1)


def test_a_segment_that_cannot_be_made_is_a_one_line_error(channel):
    client, _, store = channel
    store.prefix = "/nonexistent-dir/trainrun_state_1_"
    with pytest.raises(RuntimeError, match=r"^trainrun: cannot make a 1 MiB committed-state segment in .*No such file"):
        client.segment(1 << 20)


def test_updates_are_queued_around_requests(channel):
    client, server, _ = channel
    assert client.updates() == []
    server.notify({"ts": 1.5, "removed": False})
    assert client.segment(0) == ""  # the notice arrived first; the reply is still found
    server.notify({"ts": 2.5, "removed": True})
    assert client.updates() == [{"ts": 1.5, "removed": False}, {"ts": 2.5, "removed": True}]
    assert client.updates() == []
