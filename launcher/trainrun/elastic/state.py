"""Horovod's elastic API on trainrun's restart model (framework-free core; `trainrun.torch.elastic` binds torch).

trainrun's ranks use MPICH, whose world cannot lose a member and go on: after a failure the launcher stops
every rank and starts a new set on the hosts that remain (docs/architecture.md, "Elastic jobs"). What
Horovod does inside one process, trainrun does across processes:

    state.commit()     save() the state in memory, leave a copy with this host's agent (local rank 0 of each
                       host; the copy outlives the ranks), then check_host_updates()
    state.sync()       at the start of every attempt: the newest copy any host's agent holds (or rank 0's own
                       state when there is none) is broadcast from the lowest rank holding it and loaded
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
import pickle
import sys

from trainrun.elastic import protocol


class HostsUpdatedInterrupt(RuntimeError):
    """The job's hosts changed; raised on every rank at the same commit. `skip_sync`: hosts were only
    added (Horovod's meaning; trainrun always syncs, since the ranks restart)."""

    def __init__(self, skip_sync: bool = False):
        super().__init__("the job's hosts changed")
        self.skip_sync = skip_sync


def restart_count() -> int:
    """How many times the launcher restarted this job (0 in the first attempt)."""
    return int(os.environ.get("TRAINRUN_RESTART_COUNT", "0"))


def _runtime():
    import trainrun.runtime as rt

    return rt


class State:
    """A state that can be committed, restored and synced. Subclasses define `serialize()` -> bytes and
    `deserialize(bytes)`; `save`/`restore`/`commit`/`sync` are built on them."""

    def __init__(self):
        from trainrun.elastic.client import ControlClient

        self._reset_callbacks: list = []
        self._client = ControlClient.from_env()
        self._count = 0                 # commits in this state's lineage (the key's second half)
        self._saved: bytes | None = None
        self._last_update = 0.0         # timestamp of the last host update acted on
        self._pushed = False            # the current state is with the agent (commit() is raising)

    # what subclasses define
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
        self._saved = self.serialize()

    def restore(self) -> None:
        """Back to the last save()/commit() (or sync())."""
        if self._saved is not None:
            self.deserialize(self._saved)

    def commit(self) -> None:
        """save(), leave the copy with this host's agent (returns once it holds it), check_host_updates()."""
        self.save()
        self._count += 1
        self._push()
        self._pushed = True
        self.check_host_updates()
        self._pushed = False

    def _push(self) -> None:
        rt = _runtime()
        if self._client is not None and rt.local_rank() == 0:
            self._client.commit((restart_count(), self._count), self._saved)

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt on every rank at once if the launcher said the hosts changed
        (rank 0's view is broadcast, so all ranks agree on where to stop)."""
        if self._client is None:
            return
        updates = self._client.updates()
        newest = max([u["ts"] for u in updates], default=self._last_update)
        removed = any(u.get("removed") for u in updates)
        prev, last, removed = _runtime().broadcast_object((self._last_update, newest, removed), root_rank=0)
        self._last_update = last
        if last > prev:
            raise HostsUpdatedInterrupt(skip_sync=not removed)

    def sync(self) -> None:
        """Every rank gets the newest committed state any host holds (rank 0's own state if none)."""
        rt = _runtime()
        mine = self._client.key() if self._client is not None and rt.local_rank() == 0 else protocol.NO_KEY
        keys = [tuple(k) for k in rt.allgather_object(mine)]
        best = max(keys)
        root = keys.index(best) if best != protocol.NO_KEY else 0
        blob = None
        if rt.rank() == root:
            blob = self._client.get()[1] if best != protocol.NO_KEY else self.serialize()
        blob = rt.broadcast_object(blob, root_rank=root)
        self.deserialize(blob)
        self._saved = blob
        if best != protocol.NO_KEY:
            self._count = best[1]


class ObjectState(State):
    """Plain Python values (picklable) as attributes: `ObjectState(epoch=0, batch=0)`; `state.epoch += 1`."""

    def __init__(self, **kwargs):
        self._names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        super().__init__()

    def serialize(self) -> bytes:
        return pickle.dumps({n: getattr(self, n) for n in self._names})

    def deserialize(self, data: bytes) -> None:
        for name, value in pickle.loads(data).items():
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
                state.save()
                state._count += 1
                state._push()
            _leave_for_reset()

    return wrapper
