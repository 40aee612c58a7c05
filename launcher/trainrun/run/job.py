"""Job: run a LaunchPlan's rank groups to the end: start them, stream output, fail fast, forward
signals, clean up.

States: starting -> running -> stopping (first failure or a signal: SIGTERM to every rank, then SIGKILL
after `grace` seconds) -> done (every rank reported). A second Ctrl-C skips the grace period. When
the loop ends, every group is SIGKILLed whatever happened (grandchildren of ranks included), and a
watchdog does the same if the launcher itself is killed.

The exit code is the first failing rank's (128+N if signal N killed it); 128+N if the launcher was
interrupted by signal N with no rank failing first; else 0.
"""
from __future__ import annotations

import selectors
import signal
import socket
import time
from typing import TYPE_CHECKING

from trainrun import log
from trainrun.plan.spec import LaunchPlan
from trainrun.run.output import OutputSink
from trainrun.run.result import Failure, JobResult, exit_code_of, signame
from trainrun.run.watchdog import Watchdog

if TYPE_CHECKING:  # the seam, for readers and type checkers; not imported at run time
    from trainrun.run.groups import RankGroup

TICK = 0.05
KILL_WAIT = 5.0  # seconds after SIGKILL before giving up on hosts that do not answer


class Job:
    """Owns the job's rank groups (RankGroup: local ranks, agents of remote hosts, mpirun) until every
    rank has been reported; the RankEvents sink of all of them."""

    def __init__(self, plan: LaunchPlan, sink: OutputSink, groups: list[RankGroup], *, grace: float = 3.0,
                 start_timeout: float = 120.0):
        """`groups` must together hold every rank of `plan` exactly once."""
        self.plan = plan
        self.sink = sink
        self.grace = grace
        self.groups = groups
        self.result = JobResult()
        self.start_timeout = start_timeout
        self.world = None  # the MpiWorld, made when the first rank speaks PMI (programs without MPI never pay)
        self._stop_deadline: float | None = None
        self._kill_deadline: float | None = None
        self._specs = {p.rank: p for p in plan.procs}
        self._group_of = {s.rank: g for g in groups for s in g.specs}

    def _where(self, rank: int) -> str:
        a = self._specs[rank].assignment
        return f"rank {rank} on {a.host} (local rank {a.local_rank})"

    def fail(self, exit_code: int, what: str, rank: int | None = None) -> None:
        """Record the job's first failure and stop everything; later failures are consequences."""
        if self.result.failure is None and self._stop_deadline is None:
            tail = tuple(self.sink.stderr_tail(rank)) if rank is not None else ()
            self.result.failure = Failure(exit_code, what, rank, tail)
            self.result.exit_code = exit_code
        self.stop()

    # RankEvents, called from the loop
    def on_output(self, rank: int, stream: int, data: bytes) -> None:
        self.sink.feed(rank, stream, data)
        if self.sink.broken and self.result.interrupted_by is None:
            self._on_signal(signal.SIGPIPE)  # nobody reads our output any more: end the job as SIGPIPE would

    def on_exit(self, rank: int, returncode: int) -> None:
        self.result.returncodes[rank] = returncode
        log.info("rank %d exited with %d", rank, returncode)
        if returncode != 0:
            how = f"exited with code {returncode}" if returncode > 0 else f"was killed by {signame(-returncode)}"
            self.fail(exit_code_of(returncode), f"{self._where(rank)} {how}", rank)

    def on_pmi(self, rank: int, data: bytes) -> None:
        if self.world is None:
            from trainrun.mpi.world import MpiWorld

            self.world = MpiWorld(self.plan, self.start_timeout)
        replies, problem = self.world.feed(rank, data, time.monotonic())
        for r, line in replies:
            self._group_of[r].pmi_send(r, line)
        if problem is not None:
            self.fail(problem.exit_code, f"{self._where(problem.rank)} {problem.message}", problem.rank)

    def on_host_lost(self, host: str, message: str) -> None:
        self.fail(255, message)

    def on_host_failed(self, host: str, message: str, exit_code: int) -> None:
        self.fail(exit_code, f"{host}: {message}")

    def stop(self) -> None:
        """Begin teardown: SIGTERM to every rank now, SIGKILL after the grace period."""
        if self._stop_deadline is not None:
            return
        log.info("stopping all ranks (grace %.1fs)", self.grace)
        self._stop_deadline = time.monotonic() + self.grace
        for g in self.groups:
            g.signal(signal.SIGTERM)

    def _kill(self, wait: float = KILL_WAIT) -> None:
        """SIGKILL everything; hosts that have not reported `wait` seconds later are given up on."""
        deadline = time.monotonic() + wait
        self._kill_deadline = min(deadline, self._kill_deadline or deadline)
        for g in self.groups:
            g.kill()

    def _on_signal(self, sig: int) -> None:
        if self.result.interrupted_by is not None and sig == signal.SIGINT:
            log.info("second interrupt: killing now")
            self._kill(wait=1.0)
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
                g.start(sel, watchdog, self)
            while any(g.running for g in self.groups):
                for key, _ in sel.select(TICK):
                    key.data()
                now = time.monotonic()
                for g in self.groups:
                    g.tick(now)
                if self.world is not None and (problem := self.world.check_start(now)):
                    self.fail(problem.exit_code, f"MPI world incomplete: {problem.message}")
                if self._stop_deadline is not None and self._kill_deadline is None and now >= self._stop_deadline:
                    log.info("grace period over: SIGKILL")
                    self._kill()
                if self._kill_deadline is not None and now >= self._kill_deadline:
                    for g in self.groups:
                        g.abandon()
        finally:
            self._kill()  # leftovers: children of ranks, ranks never reported
            for g in self.groups:
                g.close(sel)
            for g in self.groups:
                g.wait_closed()
            watchdog.close()
            if self.world is not None:
                self.world.cleanup()
            self.sink.close()
            signal.set_wakeup_fd(old_wakeup)
            for s, h in old_handlers.items():
                signal.signal(s, h)
            sel.close()
            wake_r.close()
            wake_w.close()
        return self.result
