"""The mailbox: one Ray actor per RayExecutor, in the caller's Ray cluster, through which the executor's
commands reach its ranks and their outcomes come back. No port of our own: the ranks join the cluster
(`ray.init(address=...)`) and find the actor by its name, random per executor, in its own namespace.

It holds bytes only (the caller's cloudpickled commands, the ranks' cloudpickled outcomes), so it never needs
the user's modules, except in `outcome`, the value behind one of run_remote's ObjectRefs. Every method is a
coroutine: a rank's `take` and the caller's `wait` are long polls that the others' calls wake."""
from __future__ import annotations

import asyncio
import time

ERROR, OK = "error", "ok"


class Mailbox:
    """Commands in order (seq 0, 1, ...), each for some ranks; per command each such rank's outcome
    (cloudpickled `("ok", value)` or `("error", RankFailure)`); `fail(why)`: the ranks are gone (the launcher
    ended), so every wait ends with that reason; `logs`: what rank code sent through ray_logger.log."""

    def __init__(self, size: int):
        self.size = size
        self.commands: list[tuple[bytes, tuple[int, ...]]] = []
        self.outcomes: dict[int, dict[int, bytes]] = {}
        self.errors: dict[int, list[int]] = {}
        self.failed: str | None = None
        self.joined: dict[int, str] = {}
        self.log: list[bytes] = []
        self.taken: dict[int, int] = {}  # rank -> the seq it asked for last (it has run every command before)
        self._pruned = 0
        self._changed = asyncio.Event()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait(self, until: float) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), max(0.0, until - time.monotonic()))
        except asyncio.TimeoutError:
            pass

    async def join(self, rank: int, host: str) -> int:
        """A rank has joined; the number joined so far."""
        self.joined[rank] = host
        self._wake()
        return len(self.joined)

    async def post(self, blob: bytes, ranks: tuple[int, ...]) -> int:
        """A command for `ranks`; its seq."""
        self.commands.append((blob, tuple(ranks)))
        self.outcomes[len(self.commands) - 1] = {}
        self._wake()
        return len(self.commands) - 1

    async def take(self, seq: int, timeout: float, rank: int = -1) -> tuple[bytes, tuple[int, ...]] | None:
        """Command `seq` once posted; None after `timeout` seconds without it (ask again)."""
        self.taken[rank] = seq
        until = time.monotonic() + timeout
        while seq >= len(self.commands) and time.monotonic() < until:
            await self._wait(until)
        return self.commands[seq] if seq < len(self.commands) else None

    async def put(self, seq: int, rank: int, outcome: bytes, error: bool) -> None:
        """Rank `rank`'s outcome of command `seq`."""
        self.outcomes[seq][rank] = outcome
        if error:
            self.errors.setdefault(seq, []).append(rank)
        self._wake()

    async def forget(self, seq: int) -> None:
        """The caller has command `seq`'s outcomes: drop them, and the calls every rank has taken (a long
        training loop of calls keeps no more than the calls in flight)."""
        self.outcomes.pop(seq, None)
        self.errors.pop(seq, None)
        if len(self.taken) >= self.size:
            low = min(self.taken.values())
            for i in range(self._pruned, low):
                self.commands[i] = (b"", self.commands[i][1])
            self._pruned = max(self._pruned, low)

    async def send_log(self, blob: bytes) -> None:
        self.log.append(blob)

    async def logs(self, start: int) -> list[bytes]:
        """The ray_logger records from index `start` on."""
        return self.log[start:]

    async def fail(self, why: str) -> None:
        """The ranks are gone: every wait, now and later, ends with `why`."""
        self.failed = self.failed or why
        self._wake()

    async def wait(self, seq: int, timeout: float, settle: float = 1.0) -> tuple[dict[int, bytes], str | None, bool]:
        """Until every rank of command `seq` has its outcome, the mailbox failed, or `timeout` seconds passed
        (then `done` is False): (outcomes so far, the failure, done). After a rank's error the others get
        `settle` seconds more (theirs may come too: every rank that raised is named)."""
        until = time.monotonic() + timeout
        ranks = self.commands[seq][1]
        while True:
            got = self.outcomes[seq]
            if len(got) == len(ranks) or self.failed:
                return dict(got), self.failed, True
            if seq in self.errors:
                until = min(until, time.monotonic() + settle)
            if time.monotonic() >= until:
                return dict(got), self.failed, seq in self.errors
            await self._wait(until)

    async def outcome(self, seq: int, rank: int):
        """The value behind run_remote's ObjectRef for `rank`: its return value, or raises what the caller's
        run() would (RankError, RunError)."""
        import cloudpickle

        while rank not in self.outcomes[seq] and not self.failed:
            await self._wait(time.monotonic() + 3600)
        if rank not in self.outcomes[seq]:
            from trainrun.runfunc.errors import RunError

            raise RunError(f"rank {rank} gave no result: {self.failed}")
        kind, value = cloudpickle.loads(self.outcomes[seq][rank])
        if kind == ERROR:
            from trainrun.runfunc.errors import RankError

            raise RankError(value, [value])
        return value
