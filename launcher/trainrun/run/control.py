"""The owner's end of the ranks' control channels (trainrun.elastic.protocol): the per-host StateStore
that keeps the newest committed state in memory, and ControlServer, which answers the ranks of one host.

Used by the agent on every remote host and by the launcher for its own host. The store outlives the
ranks (it belongs to the agent, or to the launcher's elastic loop), so a state committed before a failure
is still here for the next attempt's `state.sync()`: no disk checkpoint.
"""
from __future__ import annotations

import json
import selectors
import socket

from trainrun import log
from trainrun.agent.wire import FrameReader, frame
from trainrun.elastic import protocol


class StateStore:
    """The newest copy committed on this host: (key, bytes). Older keys never replace newer ones."""

    def __init__(self):
        self.key: tuple[int, int] = protocol.NO_KEY
        self.blob = b""

    def put(self, key: tuple[int, int], blob: bytes) -> bool:
        if key <= self.key:
            return False
        self.key, self.blob = key, blob
        return True


class ControlServer:
    """Serves the control channels of the ranks of one host, from the owner's selector loop."""

    def __init__(self, store: StateStore):
        self.store = store
        self._socks: dict[int, tuple[socket.socket, FrameReader]] = {}

    def child_end(self, rank: int, sel: selectors.BaseSelector) -> socket.socket:
        """A new channel for `rank`: returns the end the rank inherits (the caller closes it once passed)."""
        ours, theirs = socket.socketpair()
        self._socks[rank] = (ours, FrameReader())
        sel.register(ours, selectors.EVENT_READ, lambda: self._on_readable(rank, sel))
        return theirs

    def _on_readable(self, rank: int, sel) -> None:
        sock, reader = self._socks[rank]
        try:
            data = sock.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            self._drop(rank, sel)
            return
        for kind, _r, payload in reader.feed(data):
            self._answer(rank, sock, kind, payload)

    def _answer(self, rank: int, sock: socket.socket, kind: bytes, payload: bytes) -> None:
        if kind == protocol.COMMIT:
            key = protocol.unpack_key(payload)
            if self.store.put(key, payload[protocol.KEY_STRUCT.size:]):
                log.info("rank %d committed state %s (%d bytes)", rank, key, len(self.store.blob))
            reply = frame(protocol.ACK)
        elif kind == protocol.KEY:
            reply = frame(protocol.VALUE, -1, protocol.pack_key(self.store.key))
        elif kind == protocol.GET:
            reply = frame(protocol.VALUE, -1, protocol.pack_key(self.store.key) + self.store.blob)
        else:
            log.warning("rank %d: unknown control frame %r", rank, kind)
            return
        try:
            sock.sendall(reply)
        except OSError:
            pass  # the rank is gone; its exit is reported separately

    def notify(self, update: dict) -> None:
        """Tell every rank of this host that the job's hosts changed (protocol.UPDATE)."""
        data = frame(protocol.UPDATE, -1, json.dumps(update).encode())
        for sock, _ in self._socks.values():
            try:
                sock.sendall(data)
            except OSError:
                pass

    def _drop(self, rank: int, sel) -> None:
        sock, _ = self._socks.pop(rank)
        try:
            sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()

    def release(self, sel: selectors.BaseSelector) -> None:
        """Close every channel (the ranks are gone); the store keeps its copy."""
        for rank in list(self._socks):
            self._drop(rank, sel)
