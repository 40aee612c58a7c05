"""The owner's end of the ranks' control channels (trainrun.wire.control_protocol): the per-host SegmentStore
that creates, grows and removes the committed-state segment (wire/shm_slot.py), and ControlServer, which
answers the ranks of one host.

Used by the agent on every remote host and by the launcher for its own host. The store outlives the
ranks (it belongs to the agent, or to the launcher's elastic loop), so a state committed before a failure
is still here for the next attempt's `state.sync()`: no disk checkpoint, and no copy through the channel
(the rank writes and reads the segment itself).

Segments are named `trainrun_state_<owner pid>_<job id>_<n>` (the job id of the attempt that created it,
n counting the owner's segments): `remove()` unlinks every segment of this owner at the end of the job,
and the owner's Watchdog does the same when the owner is killed (supervisor/watchdog.py: unlink_on_death).
"""
from __future__ import annotations

import json
import os
import re
import selectors
import socket

from trainrun import log
from trainrun.wire.agent_frames import FrameReader, frame
from trainrun.wire import control_protocol as protocol

SHM_DIR = "/dev/shm"
PREFIX = "trainrun_state_"


def state_segments(job_id: str, shm_dir: str = SHM_DIR) -> list[str]:
    """Committed-state segments in `shm_dir` created in job `job_id` (any owner): for leftover checks."""
    pattern = re.compile(re.escape(PREFIX) + r"\d+_" + re.escape(job_id) + r"_\d+")
    return sorted(os.path.join(shm_dir, n) for n in os.listdir(shm_dir) if pattern.fullmatch(n))


class SegmentStore:
    """This host's committed-state segment: at most one at a time (growing replaces it, keeping its newest
    complete copy). `job_id` (set by the owner for each attempt) names new segments."""

    def __init__(self, shm_dir: str = SHM_DIR):
        self.shm_dir = shm_dir
        self.job_id = "nojob"
        self.prefix = os.path.join(shm_dir, f"{PREFIX}{os.getpid()}_")
        self.path: str | None = None
        self.capacity = 0
        self._made = 0

    def segment(self, min_capacity: int) -> str:
        """The segment's path, made (or grown) so that a slot holds `min_capacity` bytes; 0: as it is
        ("" if none). OSError when /dev/shm has no room (the old segment is then kept)."""
        from trainrun.wire import shm_slot

        if min_capacity <= self.capacity:
            return self.path or ""
        self._made += 1
        path = f"{self.prefix}{re.sub(r'[^A-Za-z0-9]', '_', self.job_id)}_{self._made}"
        capacity = shm_slot.round_capacity(min_capacity)
        shm_slot.create(path, capacity)
        if self.path is not None:  # growing: the newest copy moves along, then the old file goes
            new, old = shm_slot.Segment(path, populate=False), shm_slot.Segment(self.path, populate=False)
            try:
                new.copy_newest_from(old)
            finally:
                new.close()
                old.close()
            self._unlink(self.path)
        log.info("state segment %s: %d bytes per slot", path, capacity)
        self.path, self.capacity = path, capacity
        return path

    def remove(self) -> None:
        """Unlink every segment of this owner (the end of the job)."""
        d, base = os.path.split(self.prefix)
        try:
            names = os.listdir(d)
        except OSError:
            names = []
        for name in names:
            if name.startswith(base):
                self._unlink(os.path.join(d, name))
        self.path, self.capacity = None, 0

    @staticmethod
    def _unlink(path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class ControlServer:
    """Serves the control channels of the ranks of one host, from the owner's selector loop."""

    def __init__(self, store: SegmentStore):
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
        if kind == protocol.SEGMENT:
            (need,) = protocol.SIZE_STRUCT.unpack_from(payload)
            try:
                reply = frame(protocol.VALUE, -1, self.store.segment(need).encode())
            except OSError as err:
                reply = frame(protocol.ERROR, -1, (f"trainrun: cannot make a {need >> 20} MiB committed-state "
                                                   f"segment in {self.store.shm_dir} on this host: {err.strerror or err}").encode())
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
        """Close every channel (the ranks are gone); the store keeps its segment."""
        for rank in list(self._socks):
            self._drop(rank, sel)
