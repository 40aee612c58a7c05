"""Run a LaunchPlan to the end: start every rank, stream output, fail fast, forward signals, clean up.

States: starting -> running -> stopping (first failure or a signal: SIGTERM to every rank, then SIGKILL
after `grace` seconds) -> done (every rank reported). A second Ctrl-C skips the grace period. When
the loop ends, every process group of the job is SIGKILLed whatever happened (grandchildren of ranks
included), and a watchdog does the same if the launcher itself is killed.

The exit code is the first failing rank's (128+N if signal N killed it); 128+N if the launcher was
interrupted by signal N with no rank failing first; else 0.
"""
from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import time
from dataclasses import dataclass, field

from trainrun.output import OutputSink
from trainrun.plan import LaunchPlan
from trainrun.procs import LocalRanks
from trainrun.watchdog import Watchdog

log = logging.getLogger("trainrun")
TICK = 0.05


@dataclass(frozen=True)
class RankFailure:
    rank: int
    host: str
    local_rank: int
    returncode: int
    stderr_tail: tuple[str, ...]

    @property
    def exit_code(self) -> int:
        return self.returncode if self.returncode >= 0 else 128 - self.returncode

    def describe(self) -> str:
        how = f"exited with code {self.returncode}" if self.returncode >= 0 else f"was killed by {_signame(-self.returncode)}"
        return f"rank {self.rank} on {self.host} (local rank {self.local_rank}) {how}"


@dataclass
class JobResult:
    exit_code: int
    returncodes: dict[int, int] = field(default_factory=dict)
    failure: RankFailure | None = None
    interrupted_by: int | None = None

    def summary(self, size: int) -> str | None:
        """The failure summary the launcher prints, or None for a clean run."""
        if self.failure is not None:
            f = self.failure
            others = size - 1
            lines = [f"trainrun: {f.describe()}; stopped the other {others} rank(s)" if others else f"trainrun: {f.describe()}"]
            if f.stderr_tail:
                lines.append(f"trainrun: last lines of rank {f.rank}'s stderr:")
                lines += [f"  | {line}" for line in f.stderr_tail]
            return "\n".join(lines)
        if self.interrupted_by is not None:
            return f"trainrun: interrupted by {_signame(self.interrupted_by)}; stopped all {size} rank(s)"
        return None


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class ProcessGroup:
    """Owns the job's rank groups (one LocalRanks for this machine; agents for remote hosts)."""

    def __init__(self, plan: LaunchPlan, sink: OutputSink, grace: float = 3.0):
        self.plan = plan
        self.sink = sink
        self.grace = grace
        self.result = JobResult(exit_code=0)
        self._stop_deadline: float | None = None
        self._killed = False
        self._specs = {p.rank: p for p in plan.procs}
        self.groups = [LocalRanks(list(plan.procs), self)]

    # RankEvents, called from the loop
    def on_output(self, rank: int, stream: int, data: bytes) -> None:
        self.sink.feed(rank, stream, data)

    def on_exit(self, rank: int, returncode: int) -> None:
        self.result.returncodes[rank] = returncode
        log.info("rank %d exited with %d", rank, returncode)
        if returncode != 0 and self._stop_deadline is None:
            a = self._specs[rank].assignment
            self.result.failure = RankFailure(rank, str(a.host), a.local_rank, returncode, tuple(self.sink.stderr_tail(rank)))
            self.result.exit_code = self.result.failure.exit_code
            self.stop()

    def on_pmi(self, rank: int, data: bytes) -> None:
        raise NotImplementedError("PMI is served once the MPI world is on")

    def stop(self) -> None:
        """Begin teardown: SIGTERM to every rank now, SIGKILL after the grace period."""
        if self._stop_deadline is not None:
            return
        log.info("stopping all ranks (grace %.1fs)", self.grace)
        self._stop_deadline = time.monotonic() + self.grace
        for g in self.groups:
            g.signal(signal.SIGTERM)

    def _kill(self) -> None:
        self._killed = True
        for g in self.groups:
            g.kill()

    def _on_signal(self, sig: int) -> None:
        if self.result.interrupted_by is not None and sig == signal.SIGINT:
            log.info("second interrupt: killing now")
            self._kill()
            return
        if self.result.interrupted_by is None:
            self.result.interrupted_by = sig
            if self.result.failure is None:
                self.result.exit_code = 128 + sig
        self.stop()

    def run(self) -> JobResult:
        sel = selectors.DefaultSelector()
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        caught = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        old_handlers = {s: signal.signal(s, lambda *_: None) for s in caught}
        old_wakeup = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        sel.register(wake_r, selectors.EVENT_READ, lambda: [self._on_signal(b) for b in wake_r.recv(64)])
        watchdog = Watchdog()
        try:
            for g in self.groups:
                g.start(sel, watchdog)
            while any(g.running for g in self.groups):
                for key, _ in sel.select(TICK):
                    key.data()
                now = time.monotonic()
                for g in self.groups:
                    g.tick(now)
                if self._stop_deadline is not None and not self._killed and now >= self._stop_deadline:
                    log.info("grace period over: SIGKILL")
                    self._kill()
        finally:
            self._kill()  # leftovers: children of ranks, ranks never reported
            for g in self.groups:
                g.close(sel)
            watchdog.close()
            self.sink.close()
            signal.set_wakeup_fd(old_wakeup)
            for s, h in old_handlers.items():
                signal.signal(s, h)
            sel.close()
            wake_r.close()
            wake_w.close()
        return self.result
