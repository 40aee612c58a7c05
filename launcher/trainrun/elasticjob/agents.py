"""Agents that outlive an attempt of an elastic job (elasticjob/loop.py): ElasticAgentRanks and AgentPool.

ElasticAgentRanks is an AgentRanks whose JOB says `elastic`: at the end of an attempt it does not close the
channel (which would end the agent) but waits for the agent's DONE (its ranks reaped, /dev/shm removed),
so the next attempt's frames never mix with this one's. Between attempts the pool keeps the channels
alive (heartbeats both ways) and notices hosts that go silent. The agent keeps its host's committed state.

AgentPool opens agents for the hosts an attempt needs (again for a host whose agent was lost) through the
launch's FanoutEngine, and closes them for good at the end.
"""
from __future__ import annotations

import selectors
import time

from trainrun import log
from trainrun.wire import agent_frames as wire
from trainrun.errors import HostError
from trainrun.fanout.agents import AgentRanks, read_hello
from trainrun.fanout.base import FanoutEngine
from trainrun.plan.hosts import HostSpec

DONE_WAIT = 10.0  # seconds for an agent's DONE after its attempt; past that the host is dropped


class ElasticAgentRanks(AgentRanks):
    """One host's ranks for one attempt at a time, through an agent that stays between attempts."""

    def __init__(self, agent: AgentRanks):
        super().__init__(agent.link, agent.facts, agent.reader, agent.agent_id)
        self.lost = False            # the channel ended or went silent: this agent is of no further use
        self._attempt_done = True    # DONE seen for the last attempt (or none started yet)
        self.warm = True             # the agent keeps warm ranks (--warm-ranks)

    def assign(self, specs, **kwargs) -> None:
        super().assign(specs, **kwargs)
        from dataclasses import replace

        self._job = replace(self._job, elastic=True, warm=self.warm)

    def start(self, sel: selectors.BaseSelector, watchdog, events) -> None:
        self._attempt_done = False
        super().start(sel, watchdog, events)

    def notify(self, update: dict) -> None:
        """Pass a host-update notice to this host's ranks (their control channels)."""
        import json

        self.link.write(wire.frame(wire.NOTIFY, -1, json.dumps(update).encode()))

    def _dispatch(self, kind: bytes, rank: int, payload: bytes) -> None:
        if kind == wire.DONE:
            self._attempt_done = True
        elif kind != wire.BEAT:
            super()._dispatch(kind, rank, payload)

    def _lose(self, message: str) -> None:
        self.lost = True
        super()._lose(message)

    def close(self, sel) -> None:
        """The attempt is over: stop reading for the Job (the channel stays open for the next attempt)."""
        try:
            sel.unregister(self.link.fileno())
        except (KeyError, ValueError):
            pass

    def wait_closed(self) -> None:
        """Wait for the agent's DONE (frames of the attempt still in flight are dropped); an agent that does
        not send it within DONE_WAIT seconds is marked lost."""
        if self.lost:
            return
        deadline = time.monotonic() + DONE_WAIT
        while not self._attempt_done and not self.lost:
            left = deadline - time.monotonic()
            if left <= 0:
                self.lost = True
                log.warning("agent on %s did not end its attempt within %.0fs", self.host, DONE_WAIT)
                return
            self._pump(min(left, 0.5), discard=True)

    def _pump(self, timeout: float, discard: bool) -> None:
        """Read what the agent sent within `timeout` s (between attempts: BEATs, late frames, DONE)."""
        sel = selectors.DefaultSelector()
        sel.register(self.link.fileno(), selectors.EVENT_READ)
        try:
            if not sel.select(timeout):
                return
        finally:
            sel.close()
        out, _err, ended = self.link.read()
        if out:
            self._last_heard = time.monotonic()
        for kind, _rank, _payload in self.reader.feed(out):
            if kind == wire.DONE:
                self._attempt_done = True
        if ended:
            self.lost = True

    def idle(self, now: float) -> None:
        """Between attempts: keep the channel alive both ways; a host silent past heartbeat_timeout is lost."""
        if self.lost:
            return
        self._pump(0.0, discard=True)
        if now - self._last_beat >= wire.HEARTBEAT_EVERY:
            self._last_beat = now
            self.link.write(wire.frame(wire.BEAT))
        if now - self._last_heard > self.heartbeat_timeout:
            self.lost = True

    def end(self, wait: float = 5.0) -> None:
        """Close the channel for good: the agent kills whatever is left and exits."""
        if not self.lost:
            self.link.close(wait)
        else:
            self.link.shutdown()
        self.link.disconnect()


class AgentPool:
    """The agents of an elastic job, by host name."""

    def __init__(self, engine: FanoutEngine, timeout: float, heartbeat_timeout: float, warm: bool = True):
        self.engine, self.timeout, self.heartbeat_timeout, self.warm = engine, timeout, heartbeat_timeout, warm
        self.agents: dict[str, ElasticAgentRanks] = {}

    def ensure(self, hosts: list[HostSpec]) -> dict[str, HostError]:
        """An agent on every host of `hosts` (reusing those that are alive); returns the hosts that failed."""
        for h in hosts:
            if h.name in self.agents and self.agents[h.name].lost:
                self.drop(h.name)
        need = [h for h in hosts if h.name not in self.agents]
        if not need:
            return {}
        failures = dict(self.engine.reach(need))
        links = [self.engine.start_agent(h.name) for h in need if h.name not in failures]
        for link in links:
            try:
                agent = ElasticAgentRanks(read_hello(link, self.timeout))
            except HostError as err:
                failures[link.host] = err
                link.close(wait=2.0)
                continue
            agent.heartbeat_timeout = self.heartbeat_timeout
            agent.warm = self.warm
            agent.sweeper = self.engine.sweep  # a lost host is cleaned up over a new connection
            self.agents[link.host] = agent
        return failures

    def drop(self, host: str) -> None:
        agent = self.agents.pop(host, None)
        if agent is not None:
            log.info("closing the agent on %s", host)
            agent.end(wait=2.0)

    def idle(self) -> list[str]:
        """Heartbeats between attempts; returns (and drops) the hosts found lost."""
        now, lost = time.monotonic(), []
        for name, agent in list(self.agents.items()):
            agent.idle(now)
            if agent.lost:
                lost.append(name)
                self.drop(name)
        return lost

    def close(self) -> None:
        for name in list(self.agents):
            self.drop(name)
