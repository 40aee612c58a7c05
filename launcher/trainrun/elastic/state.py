"""Horovod's elastic API on trainrun's restart model (framework-free core; `trainrun.torch.elastic` binds torch).

trainrun's ranks use MPICH, whose world cannot lose a member and go on: after a failure the launcher stops
every rank and starts a new set on the hosts that remain (docs/architecture.md, "Elastic jobs"). What
Horovod does inside one process, trainrun does across processes:

    state.commit()     save() the state; local rank 0 of each host writes it into the host's committed-state
                       segment (a /dev/shm file the agent owns: the copy outlives the ranks; shm_slot.py), at
                       memory speed (arrays and tensors as raw bytes: packing.py); then the host-update check,
                       pipelined: a notice seen at one commit is acted on (on every rank) at the next
    state.sync()       at the start of every attempt: the newest complete copy any host's segment holds (or
                       rank 0's own state when there is none) is read by the lowest rank on such a host,
                       broadcast and loaded
    state.restore()    back to the last save()/commit() of this process
    @run               sync(), then the reset callbacks when this is a restart (TRAINRUN_RESTART_COUNT > 0:
                       the world has a new size), then the function. HostsUpdatedInterrupt (the launcher said
                       the hosts changed) commits and leaves with RESET_EXIT_CODE: the launcher restarts the
                       job on the new hosts. Any other exception (HorovodInternalError included: a peer died)
                       ends the process; the launcher restarts the job and sync() resumes from the last commit.

Copies are ordered by (restart count, commit count) (protocol.py). Without TRAINRUN_CTL_FD (not started by
an elastic trainrun) commits stay in memory and sync() broadcasts rank 0's state.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING

from trainrun.wire import control_protocol as protocol

if TYPE_CHECKING:
    from trainrun.runtime.horovod_env import Settings


class HostsUpdatedInterrupt(RuntimeError):
    """The job's hosts changed; raised on every rank at the same commit. `skip_sync`: hosts were only
    added (Horovod's meaning; trainrun always syncs, since the ranks restart)."""

    def __init__(self, skip_sync: bool = False):
        super().__init__("the job's hosts changed")
        self.skip_sync = skip_sync


def restart_count() -> int:
    """How many times the launcher restarted this job (0 in the first attempt): TRAINRUN_RESTART_COUNT, read
    at init (runtime/horovod_env.py); ValueError before init."""
    return _settings().restart_count


def _runtime():
    import trainrun.runtime as rt

    return rt


def _settings() -> Settings:
    """The runtime's settings (read once at init; ValueError before init)."""
    from trainrun.runtime import lifecycle

    return lifecycle.settings()


class State:
    """A state that can be committed, restored and synced. Subclasses define `snapshot()` -> one picklable
    object (NumPy arrays and CPU torch tensors in it are stored as raw bytes: packing.py) and `load(obj)`;
    `save`/`restore`/`commit`/`sync` are built on them. (A subclass may define `serialize()` -> bytes and
    `deserialize(bytes)` instead: the defaults of snapshot/load call them.)

    Where copies live: save() packs the state into a buffer of this process (reused, so a save costs about
    a memcpy). commit() on the rank that keeps the host's copy (local rank 0, under an elastic trainrun)
    packs it straight into the host's committed-state segment instead (shm_slot.py; the agent owns the
    file, so the copy outlives the rank), and restore() then reads it back from there."""

    def __init__(self):
        from trainrun.elastic.client import ControlClient

        self._reset_callbacks: list = []
        self._client = ControlClient.from_env()
        self._count = 0                 # commits in this state's lineage (the key's second half)
        self._saved = None              # the last save()/commit(): a packed payload (uint8 array) or _IN_SEGMENT
        self._buf = None                # save()'s reusable buffer
        self._segment = None            # the host's committed-state segment (shm_slot.Segment), when mapped
        self._last_update = 0.0         # timestamp of the last host update acted on
        self._pushed = False            # the current state is with the agent (commit() is raising)
        self._pending = None            # the host-update broadcast a commit started (acted on at the next)
        self._packer = None             # packing.Packer, made at the first save/commit
        self._keeper = None             # keeps the host's copy (local rank 0 of an elastic job); asked once
        # the launcher says when it will never announce a host change (no elastic sizing: TRAINRUN_HOST_UPDATES=0,
        # a setting read at init): no check then. Asked at the first check (a State may be made before init).
        self._host_updates: bool | None = None

    # what subclasses define
    def snapshot(self):
        """The state as one picklable object (not copied: commit/save copy it at once)."""
        return self.serialize()

    def load(self, obj) -> None:
        """Make the state what snapshot() returned (`obj` is this process's own copy)."""
        self.deserialize(obj)

    def serialize(self) -> bytes:
        raise NotImplementedError

    def deserialize(self, data: bytes) -> None:
        raise NotImplementedError

    # Horovod's State API
    def register_reset_callbacks(self, callbacks) -> None:
        """Functions called (no arguments) after a reset, once the state is synced: e.g. rescale the
        learning rate by the new size()."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def save(self) -> None:
        """Keep a copy of the state in this process (restore() goes back to it)."""
        packed = self._pack()
        if self._buf is None or self._buf.size < packed.size:
            import numpy as np

            self._buf = np.empty(packed.size + packed.size // 4, dtype=np.uint8)
        packed.write_into(self._buf)
        self._saved = self._buf[:packed.size]

    def restore(self) -> None:
        """Back to the last save()/commit() (or sync())."""
        from trainrun.elastic import packing

        if self._saved is _IN_SEGMENT:
            found = self._segment.newest()
            if found is not None:
                self.load(packing.unpack(self._segment.payload(found[0])))
        elif self._saved is not None:
            self.load(packing.unpack(self._saved))

    def commit(self) -> None:
        """save(), leave the copy with this host's agent (in its segment), then the host-update check without
        waiting for the other ranks: rank 0's view of the notices is broadcast in the background and acted on
        at the next commit (every rank raises HostsUpdatedInterrupt at that same commit, once its state is
        committed). So commit() costs the copy, not a round trip through every rank."""
        self._commit_copy()
        self._pushed = True
        self._check_pipelined()
        self._pushed = False

    def _update_view(self):
        import numpy as np

        updates = self._client.updates()
        newest = max([u["ts"] for u in updates], default=self._last_update)
        removed = any(u.get("removed") for u in updates)
        return np.array([self._last_update, newest, float(removed)], dtype=np.float64)

    def _act_on(self, view) -> None:
        prev, last, removed = view.tolist()
        self._last_update = last
        if last > prev:
            raise HostsUpdatedInterrupt(skip_sync=not removed)

    def _announced(self) -> bool:
        """Whether the launcher may announce a host change to this rank (asked once, after init)."""
        if self._host_updates is None:
            self._host_updates = self._client is not None and _settings().host_updates
        return self._host_updates

    def _check_pipelined(self) -> None:
        if not self._announced():
            return
        rt = _runtime()
        pending, self._pending = self._pending, None
        if pending is not None:
            self._act_on(rt.synchronize(pending))  # raised on every rank alike: none starts another
        self._pending = rt.broadcast_async(self._update_view(), root_rank=0)

    def _pack(self):
        if self._packer is None:
            from trainrun.elastic import packing

            self._packer = packing.Packer()
        return self._packer.pack(self.snapshot())

    def _commit_copy(self) -> None:
        self._count += 1
        if self._keeper is None:  # what a commit does here is asked once (every commit is on the step's path)
            self._keeper = (self._client is not None and _runtime().local_rank() == 0, restart_count())
        keeps, attempt = self._keeper
        if not keeps:
            self.save()
            return
        packed = self._pack()
        self._writable_segment(packed.size).write((attempt, self._count), packed)
        self._saved = _IN_SEGMENT

    def _writable_segment(self, size: int):
        """The host's segment, mapped, with slots of at least `size` bytes (the agent grows it if needed)."""
        from trainrun.wire import shm_slot

        if self._segment is not None and self._segment.capacity >= size:
            return self._segment
        path = self._client.segment(size)
        if self._segment is not None:
            self._segment.close()
        self._segment = shm_slot.Segment(path)
        return self._segment

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt on every rank at once if the launcher said the hosts changed
        (rank 0's view is broadcast, so all ranks agree on where to stop). Nothing to check, and no
        collective, when the launcher will announce no change (TRAINRUN_HOST_UPDATES=0: no elastic sizing)."""
        if not self._announced():
            return
        rt = _runtime()
        pending, self._pending = self._pending, None
        if pending is not None:
            self._act_on(rt.synchronize(pending))
        self._act_on(rt.broadcast(self._update_view(), root_rank=0))

    def _held_here(self):
        """(key, slot) of the newest complete copy in this host's segment (checked), or (NO_KEY, None)."""
        from trainrun.wire import shm_slot

        if self._client is None or _runtime().local_rank() != 0:
            return protocol.NO_KEY, None
        if self._segment is None:
            path = self._client.segment(0)
            if not path:
                return protocol.NO_KEY, None
            self._segment = shm_slot.Segment(path)
        found = self._segment.newest()
        return (found[1].key, found[0]) if found is not None else (protocol.NO_KEY, None)

    def sync(self) -> None:
        """Every rank gets the newest committed state any host holds (rank 0's own state if none): the
        lowest rank whose host holds it reads it from its segment and broadcasts the bytes."""
        import numpy as np

        from trainrun.elastic import packing

        rt = _runtime()
        mine, slot = self._held_here()
        keys = [tuple(k) for k in rt.allgather_object(mine)]
        best = max(keys)
        root = keys.index(best) if best != protocol.NO_KEY else 0
        data: np.ndarray = np.empty(0, dtype=np.uint8)
        if rt.rank() == root:
            data = (self._segment.payload(slot).copy() if best != protocol.NO_KEY
                    else packing.pack(self.snapshot()).to_array())
        n = rt.broadcast(np.array([data.size], dtype=np.int64), root_rank=root)
        if rt.rank() != root:
            data = np.empty(int(n[0]), dtype=np.uint8)
        data = rt.broadcast(data, root_rank=root)
        self.load(packing.unpack(data))
        self._saved = data
        if best != protocol.NO_KEY:
            self._count = best[1]


_IN_SEGMENT = object()  # State._saved: the last commit, read back from the host's segment


class ObjectState(State):
    """Plain Python values (picklable) as attributes: `ObjectState(epoch=0, batch=0)`; `state.epoch += 1`."""

    def __init__(self, **kwargs):
        self._names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        super().__init__()

    def snapshot(self) -> dict:
        return {n: getattr(self, n) for n in self._names}

    def load(self, obj: dict) -> None:
        for name, value in obj.items():
            setattr(self, name, value)


def _leave_for_reset() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(protocol.RESET_EXIT_CODE)  # no MPI_Finalize: the launcher ends the world and removes its shm


def run(func):
    """Horovod's `@hvd.elastic.run`: `func(state, ...)` is the training function (see the module doc)."""

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs):
        state.sync()
        if restart_count() > 0:
            state.on_reset()
        try:
            return func(state, *args, **kwargs)
        except HostsUpdatedInterrupt:
            if not state._pushed:  # raised by check_host_updates() outside commit(): keep where we are
                state._commit_copy()
            _leave_for_reset()

    return wrapper
