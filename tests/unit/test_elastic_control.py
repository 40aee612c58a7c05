"""The control channel (elastic/protocol.py): a rank's ControlClient against the owner's ControlServer and
StateStore, over a real socketpair, the server driven by a selector loop on a thread (as in an agent)."""
import selectors
import threading

import pytest

from trainrun.elastic import protocol
from trainrun.elastic.client import ControlClient
from trainrun.run.control import ControlServer, StateStore


def test_store_keeps_only_newer_keys():
    store = StateStore()
    assert store.key == protocol.NO_KEY
    assert store.put((0, 2), b"a") and not store.put((0, 1), b"old") and not store.put((0, 2), b"same")
    assert store.put((1, 1), b"b")  # a later attempt supersedes any count of an earlier one
    assert (store.key, store.blob) == ((1, 1), b"b")


@pytest.fixture
def channel():
    store, sel = StateStore(), selectors.DefaultSelector()
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


def test_commit_then_key_and_get_round_trip(channel):
    client, _, store = channel
    assert client.key() == protocol.NO_KEY
    blob = bytes(range(256)) * 20000  # 5 MiB: many reads on both ends
    client.commit((0, 3), blob)
    assert store.key == (0, 3) and store.blob == blob  # held once commit() returned
    assert client.key() == (0, 3)
    assert client.get() == ((0, 3), blob)


def test_updates_are_queued_around_requests(channel):
    client, server, _ = channel
    assert client.updates() == []
    server.notify({"ts": 1.5, "removed": False})
    assert client.key() == protocol.NO_KEY  # the notice arrived first; the reply is still found
    server.notify({"ts": 2.5, "removed": True})
    assert client.updates() == [{"ts": 1.5, "removed": False}, {"ts": 2.5, "removed": True}]
    assert client.updates() == []
