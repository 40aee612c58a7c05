"""Run a LaunchPlan to the end: start every rank, stream output, fail fast, forward signals, clean up.

States: starting -> running -> stopping (first failure or a signal: SIGTERM to every rank, then SIGKILL
after `grace` seconds) -> done (every rank reported). A second Ctrl-C skips the grace period. When
the loop ends, every process group of the job is SIGKILLed whatever happened (grandchildren of ranks
included), and a watchdog does the same if the launcher itself is killed.

The exit code is the first failing rank's (128+N if signal N killed it); 128+N if the launcher was
interrupted by signal N with no rank failing first; else 0.
"""
from __future__ import annotations

import selectors
import signal
import socket
import time
from dataclasses import dataclass, field

from trainrun import log
from trainrun.output import OutputSink
from trainrun.plan import LaunchPlan
from trainrun.procs import LocalRanks
from trainrun.watchdog import Watchdog

TICK = 0.05
KILL_WAIT = 5.0  # seconds after SIGKILL before giving up on hosts that do not answer


@dataclass(frozen=True)
class Failure:
    """Why the job failed: the first failing rank (or the MPI world), with the exit code it implies."""

    exit_code: int
    what: str
    rank: int | None = None
    stderr_tail: tuple[str, ...] = ()


@dataclass
class JobResult:
    exit_code: int
    returncodes: dict[int, int] = field(default_factory=dict)
    failure: Failure | None = None
    interrupted_by: int | None = None

    def summary(self, size: int) -> str | None:
        """The failure summary the launcher prints, or None for a clean run."""
        if self.failure is not None:
            f = self.failure
            lines = [f"trainrun: {f.what}; stopped all {size} rank(s)" if size > 1 else f"trainrun: {f.what}"]
            if f.stderr_tail:
                lines.append(f"trainrun: last lines of rank {f.rank}'s stderr:")
                lines += [f"  | {line}" for line in f.stderr_tail]
            return "\n".join(lines)
        if self.interrupted_by is not None:
            return f"trainrun: interrupted by {_signame(self.interrupted_by)}; stopped all {size} rank(s)"
        return None


def exit_code_of(returncode: int) -> int:
    """A rank's returncode as a shell would report it: 128+N for signal N."""
    return returncode if returncode >= 0 else 128 - returncode


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class ProcessGroup:
    """Owns the job's rank groups (one LocalRanks for this machine; agents for remote hosts)."""

    def __init__(self, plan: LaunchPlan, sink: OutputSink, grace: float = 3.0, mpi: bool = True,
                 start_timeout: float = 120.0, agents: dict | None = None, python: str | None = None,
                 forward_env: dict | None = None, heartbeat_timeout: float = 15.0):
        """`agents` maps each remote host name to its opened AgentRanks (remote.py); all other hosts
        of the plan must be this machine."""
        self.plan = plan
        self.sink = sink
        self.grace = grace
        self.result = JobResult(exit_code=0)
        self._stop_deadline: float | None = None
        self._kill_deadline: float | None = None
        self._specs = {p.rank: p for p in plan.procs}
        self.start_timeout = start_timeout
        self.world = None  # the MpiWorld, made when the first rank speaks PMI (programs without MPI never pay)
        agents = agents or {}
        local_procs = [p for p in plan.procs if p.host not in agents]
        self.groups = [LocalRanks(local_procs, self, pmi=mpi)] if local_procs else []
        for host, agent in agents.items():
            agent.bind(plan.by_host()[host], self, pmi=mpi, python=python, env=forward_env or {},
                       heartbeat_timeout=heartbeat_timeout)
            self.groups.append(agent)
        self._group_of = {s.rank: g for g in self.groups for s in g.specs}

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
            how = f"exited with code {returncode}" if returncode > 0 else f"was killed by {_signame(-returncode)}"
            self.fail(exit_code_of(returncode), f"{self._where(rank)} {how}", rank)

    def on_pmi(self, rank: int, data: bytes) -> None:
        if self.world is None:
            from trainrun.mpiworld import MpiWorld

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
                g.start(sel, watchdog)
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
