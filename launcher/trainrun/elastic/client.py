"""The rank's end of the control channel (protocol.py): ask the host's agent for the committed-state
segment (its path; the rank maps it: shm_slot.py), and collect the launcher's host-update notices. Stdlib
only; blocking requests.
"""
from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping

from trainrun.wire.agent_frames import FrameReader, frame
from trainrun.wire import control_protocol as protocol


# Process-wide, not per session, on purpose: the control channel is an fd the process inherited
# (TRAINRUN_CTL_FD), and one socket object per fd must serve every State for the process's life (a second
# one would close the fd when collected), whatever init()/shutdown() do. That is also why TRAINRUN_CTL_FD is
# read here, not through the runtime's settings (runtime/horovod_env.py lists it): a State may be made
# before init().
_clients: dict[int, ControlClient] = {}


class ControlClient:
    """One rank's channel (the inherited fd `fd`). Requests are answered in order; UPDATE frames that
    arrive meanwhile are queued for `updates()`."""

    def __init__(self, fd: int):
        self.sock = socket.socket(fileno=fd)
        self.sock.setblocking(True)
        self.reader = FrameReader()
        self._updates: list[dict] = []
        self._replies: list[tuple[bytes, bytes]] = []

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> ControlClient | None:
        """The process's one client for TRAINRUN_CTL_FD (shared by every State: a second socket object on the
        same fd would close it when collected), or None outside an elastic trainrun job."""
        fd = environ.get("TRAINRUN_CTL_FD")
        if not fd:
            return None
        if int(fd) not in _clients:
            _clients[int(fd)] = cls(int(fd))
        return _clients[int(fd)]

    def _take(self, frames) -> None:
        for kind, _rank, payload in frames:
            if kind == protocol.UPDATE:
                self._updates.append(json.loads(payload))
            else:
                self._replies.append((kind, payload))

    def _request(self, kind: bytes, payload: bytes = b"") -> tuple[bytes, bytes]:
        self.sock.sendall(frame(kind, -1, payload))
        while not self._replies:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("trainrun: the control channel to this host's agent closed")
            self._take(self.reader.feed(data))
        return self._replies.pop(0)

    def segment(self, min_capacity: int = 0) -> str:
        """The path of this host's committed-state segment, with slots of at least `min_capacity` bytes
        (the owner creates or grows it); min_capacity 0: the current one, "" when there is none.
        RuntimeError with the owner's one-line reason when it cannot (e.g. /dev/shm is full)."""
        kind, payload = self._request(protocol.SEGMENT, protocol.SIZE_STRUCT.pack(min_capacity))
        if kind == protocol.ERROR:
            raise RuntimeError(payload.decode(errors="replace"))
        return payload.decode()

    def updates(self) -> list[dict]:
        """Host-update notices received so far (read without blocking), oldest first; clears the queue."""
        try:
            while True:
                data = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)  # one syscall (every commit calls this)
                if not data:
                    break
                self._take(self.reader.feed(data))
        except (BlockingIOError, InterruptedError):
            pass
        out, self._updates = self._updates, []
        return out
