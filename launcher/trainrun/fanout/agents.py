"""The launcher's side of a host agent: AgentRanks drives one host's ranks through one AgentLink
(whatever fan-out engine opened it), and `open_agents` starts one agent per host through an engine.

AgentRanks is a RankGroup (supervisor/groups.py), so the Job treats a remote host exactly like its own.
States: opened (HELLO read: host facts known) -> assigned (its specs) -> started (JOB sent) -> done
(every rank reported, or the channel ended, or the agent was silent for `heartbeat_timeout` s, or the
launcher gave up on it after SIGKILL: every unreported rank is then reported lost).

A lost host is cleaned up over a fresh connection when the engine can open one (`sweeper`: the engine's
`sweep`, run in a thread): the agent's whole tree (its pid and start time came in HELLO) and every process
of the job there, then the job's /dev/shm segments and stack files there (supervisor/reaper.py). `cleanup_note`, set by wait_closed, says what came of it: killed, or
unreachable, with the ranks that may still run and within how many seconds the agent there ends them
(the agent's own patience: it kills its ranks after `heartbeat_timeout` + 2 s without word from us).

The agent's clock: every BEAT we send carries our clock and the agent echoes it at once with its own;
`clock` (clock.py) keeps the offset, and the exit times the agent reports are put on our clock with it
before they reach the Job, so failures on different hosts can be ordered.
"""
from __future__ import annotations

import json
import math
import selectors
import threading
import time
from dataclasses import replace

from trainrun import log
from trainrun.wire import agent_frames as wire
from trainrun.wire.agent_messages import AgentJob, Beat, DumpReply, DumpRequest, ExitReport
from trainrun.errors import HostError, HostsError
from trainrun.plan.facts import HostFacts
from trainrun.fanout.base import AgentLink, FanoutEngine, Sweeper
from trainrun.fanout.clock import ClockOffset
from trainrun.plan.hosts import HostSpec
from trainrun.plan.spec import ProcessSpec
from trainrun.supervisor.groups import ExitInfo, RankEvents

LOST = 255  # returncode reported for ranks of a host whose agent or connection was lost
AGENT_PATIENCE = 1  # x heartbeat_timeout, + one beat: how long an agent waits for a silent launcher
SWEEP_WAIT_S = 20.0  # at most this long for the whole cleanup of a lost host (connect, kill, answer)
FIRST_BEATS_EVERY, FIRST_BEATS_FOR = 0.2, 3.0  # seconds: more clock samples while the job starts


class AgentRanks:
    """One host's ranks, run by its agent at the other end of `link`."""

    def __init__(self, link: AgentLink, facts: HostFacts, reader: wire.FrameReader | None = None,
                 agent_id: str | None = None):
        """`agent_id`: "PID:START" of the agent process on its host (from HELLO; None from an older agent)."""
        self.link = link
        self.agent_id = agent_id
        self.sweeper: Sweeper | None = None  # the engine's sweep (set by whoever opened the agent's link)
        self.cleanup_note: str | None = None
        self.may_still_run = 0  # ranks of this host left running where cleanup could not reach (cleanup_note)
        self._lost_ranks = 0
        self._sweep: threading.Thread | None = None
        self._sweep_result: list = []
        self._lost_at = self._silent_since = 0.0  # when the host was lost, and last heard before (_start_sweep)
        self.host = link.host
        self.facts = facts
        self.reader = reader or wire.FrameReader()
        self.events: RankEvents | None = None
        self.specs: list[ProcessSpec] = []
        self._pending: set[int] = set()
        self._ended = False
        self.heartbeat_timeout = 15.0
        self._last_heard = self._last_beat = time.monotonic()
        self.clock = ClockOffset()
        self._started = time.monotonic()

    def assign(self, specs: list[ProcessSpec], *, pmi: bool, python: str, env: dict[str, str],
               heartbeat_timeout: float = 15.0, restartable: bool = False) -> None:
        """Give this agent its share of the job (sent on start). `env` (the launcher's forwarded
        variables) goes under each rank's own env; it travels in the channel, never on a command line.
        The agent gives up on a silent launcher after AGENT_PATIENCE x heartbeat_timeout + one beat
        (HEARTBEAT_EVERY): seconds, so that the ranks of a host cut off from the launcher do not run on for
        long, and after the launcher has named the host lost. A launcher that cannot write its output for
        that long (a paused pager) loses its hosts."""
        self.specs = specs
        self.heartbeat_timeout = heartbeat_timeout
        self._job_id = specs[0].env.get("TRAINRUN_JOB_ID") if specs else None
        self._mark_host = specs[0].env.get("TRAINRUN_HOSTNAME", specs[0].host) if specs else self.host
        self._pending = {s.rank for s in specs}
        kvsname = None
        if pmi and specs:
            from trainrun.mpiworld.shm import kvsname_for

            kvsname = kvsname_for(specs[0].env["TRAINRUN_JOB_ID"])  # its shm segments to remove
        procs = tuple(replace(s, env={**env, **s.env}) for s in specs)
        # one beat longer than we wait for it: in a cut, we name the host lost before its ranks are killed
        patience = AGENT_PATIENCE * heartbeat_timeout + wire.HEARTBEAT_EVERY
        self._job = AgentJob(procs, pmi, python, patience, kvsname, restartable=restartable)

    def start(self, sel: selectors.BaseSelector, watchdog, events: RankEvents) -> None:
        self.events = events
        self._last_heard = self._started = time.monotonic()
        self.link.write(wire.frame(wire.JOB, -1, self._job.to_bytes()))
        self._beat()  # a first clock sample before any rank can fail
        sel.register(self.link.fileno(), selectors.EVENT_READ, lambda: self._on_readable(sel))

    def _on_readable(self, sel) -> None:
        out, err, ended = self.link.read()
        if out or err:
            self._last_heard = time.monotonic()
        if err:
            for line in err.decode(errors="replace").splitlines():
                log.warning("agent on %s: %s", self.host, line)
        for kind, rank, payload in self.reader.feed(out):
            self._dispatch(kind, rank, payload)
        if ended and not self._ended:
            self._ended = True
            sel.unregister(self.link.fileno())
            why = self.link.why_ended()  # what the kernel said, where the engine knows
            self._lose(f"lost the agent on {self.host} ({why or 'connection dropped or agent killed'})")

    def _lose(self, message: str) -> None:
        """Report every rank not yet reported as lost (the host is gone for this job), and start cleaning
        the host up over a fresh connection."""
        if self._pending:
            assert self.events is not None  # ranks are pending only once start() gave the events
            lost = len(self._pending)
            self._start_sweep(lost)
            self.events.on_host_lost(self.host, message)
            for rank in sorted(self._pending):
                self.events.on_exit(rank, LOST)
            self._pending.clear()
            self._lost_ranks = lost

    def _start_sweep(self, ranks: int) -> None:
        if self.sweeper is None or self._job_id is None or self._sweep is not None:
            return
        self._lost_at, self._silent_since = time.monotonic(), self._last_heard

        def work():
            try:
                self._sweep_result.append(self.sweeper(self.host, self._job_id, self._mark_host, self.agent_id))
            except Exception as err:  # noqa: BLE001 - any failure is reported as "could not clean up"
                self._sweep_result.append(f"{type(err).__name__}: {err}")

        self._sweep = threading.Thread(target=work, name=f"trainrun-sweep-{self.host}", daemon=True)
        self._sweep.start()

    def _finish_sweep(self) -> None:
        """Wait (bounded) for the cleanup of a lost host and say what came of it in `cleanup_note`."""
        if self._sweep is None or self.cleanup_note is not None:
            return
        self._sweep.join(max(0.0, self._lost_at + SWEEP_WAIT_S - time.monotonic()))
        n = self._lost_ranks
        if self._sweep_result and self._sweep_result[0] is None:
            self.cleanup_note = f"{self.host}: killed its agent and its {n} rank(s) over a new connection"
            return
        why = self._sweep_result[0] if self._sweep_result else f"no answer within {SWEEP_WAIT_S:.0f}s"
        patience = self._job.patience
        # the agent last heard us at most one beat before we last heard it; it gives up `patience` s later
        left = max(1, math.ceil(self._silent_since + wire.HEARTBEAT_EVERY + patience + 1 - time.monotonic()))
        self.cleanup_note = (f"{self.host} unreachable ({why}): its {n} rank(s) may still run; the agent there "
                             f"ends them within {left}s ({patience:g}s without word from the launcher)")
        self.may_still_run = n

    def _dispatch(self, kind: bytes, rank: int, payload: bytes) -> None:
        assert self.events is not None  # frames are read only once start() gave the events
        if kind in wire.KIND_STREAM:
            self.events.on_output(rank, wire.KIND_STREAM[kind], payload)
        elif kind == wire.EXIT:
            self._pending.discard(rank)
            report = ExitReport.from_bytes(payload)
            info = None if report.at is None else ExitInfo(self.clock.to_launcher(report.at), report.oom, self.clock.error or 0.0)
            self.events.on_exit(rank, report.returncode, info)
        elif kind == wire.PMI:
            self.events.on_pmi(rank, payload)
        elif kind == wire.FATAL:
            message, _, code = payload.decode().rpartition("|")
            self.events.on_host_failed(self.host, message, int(code))
            if not self._job.elastic:
                # the agent said why it gives up (its ranks did not all start) and now exits: its ranks are
                # accounted for by that failure, so the channel's end that follows is no host loss
                self._pending.clear()
        elif kind == wire.STARTED:
            log.info("%s: ranks started, pids %s", self.host, json.loads(payload))
        elif kind == wire.BEAT:
            beat = Beat.from_bytes(payload)
            if beat is not None and beat.echo is not None:
                self.clock.add(beat.echo, beat.t, time.time())
        elif kind == wire.PROGRESS:
            self.events.on_progress(rank, payload.decode(errors="replace"))
        elif kind == wire.STALL:
            self.events.on_stall(rank, payload.decode(errors="replace"))
        elif kind == wire.STACKS:
            reply = DumpReply.from_bytes(payload)
            self.events.on_stacks(reply.request, list(reply.stacks))

    @property
    def running(self) -> int:
        return len(self._pending)

    def tick(self, now: float) -> None:
        """Heartbeats: send ours; a host silent for heartbeat_timeout is lost (hung, paused, cut off)."""
        if not self._pending:
            return
        # beats come often at first: the clock offset's best sample is the one with the shortest round trip
        every = FIRST_BEATS_EVERY if now - self._started < FIRST_BEATS_FOR else wire.HEARTBEAT_EVERY
        if now - self._last_beat >= every:
            self._beat()
        silent = now - self._last_heard
        if silent > self.heartbeat_timeout:
            self._lose(f"no word from the agent on {self.host} for {silent:.0f}s (host hung or unreachable; "
                       "--heartbeat-timeout)")

    def _beat(self) -> None:
        self._last_beat = time.monotonic()
        self.link.write(wire.frame(wire.BEAT, -1, Beat(time.time()).to_bytes()))

    def dump(self, request: int, use_py_spy: bool) -> None:
        self.link.write(wire.frame(wire.DUMP, -1, DumpRequest(request, use_py_spy).to_bytes()))

    def abandon(self) -> None:
        """Stop waiting for this host (after SIGKILL went unanswered)."""
        self._lose(f"no answer from the agent on {self.host} after SIGKILL")

    def signal(self, sig: int) -> None:
        self.link.write(wire.frame(wire.SIGNAL, -1, str(int(sig)).encode()))

    def kill(self) -> None:
        self.link.write(wire.frame(wire.KILL))

    def pmi_send(self, rank: int, data: bytes) -> None:
        self.link.write(wire.frame(wire.PMI, rank, data))

    def restart(self, rank: int, count: int) -> None:
        """Start ended rank `rank` again on this host (assign(restartable=True) only)."""
        self._pending.add(rank)
        self.link.write(wire.frame(wire.RESTART, rank, str(count).encode()))

    def disconnect(self) -> None:
        """Close the host's connection (after close())."""
        self.link.disconnect()

    def close(self, sel) -> None:
        """End the channel's input: the agent kills whatever is left and exits (see wait_closed)."""
        if self.clock.error is not None:
            log.info("%s: clock offset %+.1f ms (+- %.1f ms)", self.host, 1000 * self.clock.offset, 1000 * self.clock.error)
        try:
            sel.unregister(self.link.fileno())
        except (KeyError, ValueError):
            pass
        self.link.shutdown()

    def wait_closed(self) -> None:
        """Wait until the agent has ended; called after close() on every group, so agents end in parallel.
        A host that stopped answering is not waited for, but its cleanup over a fresh connection is."""
        if time.monotonic() - self._last_heard < self.heartbeat_timeout:
            self.link.wait(5.0)
        self._finish_sweep()


def read_hello(link: AgentLink, timeout: float) -> AgentRanks:
    """Wait for the agent's HELLO on `link`; raises HostError (stage "agent") with the agent's last
    stderr line when it does not start."""
    reader, errors, deadline = wire.FrameReader(), b"", time.monotonic() + timeout
    sel = selectors.DefaultSelector()
    sel.register(link.fileno(), selectors.EVENT_READ)
    try:
        while time.monotonic() < deadline:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                continue
            out, err, ended = link.read()
            errors += err
            for kind, _rank, payload in reader.feed(out):
                if kind == wire.HELLO:
                    doc = json.loads(payload)
                    return AgentRanks(link, HostFacts.from_json(doc), reader, doc.get("agent"))
            if ended:
                break
    finally:
        sel.close()
    from trainrun.fanout.python_pick import no_python_error

    if (no_python := no_python_error(link.host, errors.decode(errors="replace"))) is not None:
        raise no_python  # its line came with or after the channel's end (srun: stderr after stdout's EOF)
    text = errors.decode(errors="replace").strip().splitlines()
    last = text[-1] if text else "no output"
    if "No module named" in last and "trainrun" in last:
        raise HostError(link.host, "agent", f"trainrun is not installed for the remote Python ({last})", hint="pip install trainrun there, or pass --python")
    raise HostError(link.host, "agent", f"the trainrun agent did not start: {last}", hint="run trainrun --check")


def open_agents(engine: FanoutEngine, hosts: list[HostSpec], timeout: float) -> dict[str, AgentRanks]:
    """Reach every host through `engine`, start an agent on each and read its HELLO (all in parallel).

    Raises HostsError with every host's cause, after closing the agents that did start, if any host fails.
    """
    failures = list(engine.reach(hosts).values())
    links, agents = [], {}
    try:
        if not failures:
            links = [engine.start_agent(h.name) for h in hosts]
            for link in links:  # started together above, so the HELLOs arrive in parallel
                try:
                    agents[link.host] = read_hello(link, timeout)
                except HostError as err:
                    failures.append(err)
    finally:
        if failures or len(agents) < len(hosts):
            for link in links:
                link.close(wait=2.0)
            engine.close()
    if failures:
        raise HostsError(failures)
    for agent in agents.values():
        agent.sweeper = engine.sweep
    return agents
