"""The elastic loop: run a job as a series of attempts until it succeeds, fails for good, or is interrupted.

An attempt is an ordinary Job under the attempt's exit policy (elasticjob/attempt.py's AttemptPolicy, which
records how its ranks ended), assembled as a static job's is (supervisor/assemble.py) and planned by the one
planner on the hosts the
policy picks (elasticjob/policy.py). MPICH ranks cannot re-form their world after a peer died, so a
restart stops every rank and starts a new set; the agents (and this launcher) stay, and so does the state
the ranks committed with them (elasticjob/control.py: a /dev/shm segment per host, removed at the end). Each rank sees TRAINRUN_RESTART_COUNT (the attempt number).

    failure   a rank or host failed: record it (FailureRecord), cool the host down (elastic sizing), and
              restart after a back-off -- unless every rank failed the same way at start-up (a restart
              would too: end now, saying so) or --max-restarts are used up (end with its code and the list)
    reset     the hosts changed (discovery or a cool-down ended): the ranks were told, committed and left
              with RESET_EXIT_CODE; restart at once on the new hosts (not a failure)
    success   every rank exited 0: exit 0 (listing the failures that were survived, if any)
"""
from __future__ import annotations

import signal
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from trainrun import log
from trainrun.errors import HostsError
from trainrun.plan.placement import ranks_per_host
from trainrun.plan.planner import JobShape
from trainrun.elasticjob.discovery import LiveHosts
from trainrun.elasticjob.policy import AttemptHosts, CooldownBook, ElasticSettings, FailureRecord, backoff, deterministic, pick_hosts

if TYPE_CHECKING:
    from trainrun.plan.facts import HostFacts
    from trainrun.fanout.agents import AgentRanks
    from trainrun.fanout.base import FanoutEngine
    from trainrun.elasticjob.agents import AgentPool
    from trainrun.launchspec import LaunchSpec
    from trainrun.elasticjob.spares import SparePool

IDLE_TICK = 0.2


class _Interrupted(Exception):
    def __init__(self, sig: int):
        self.sig = sig


def _raise_interrupt(sig, _frame):
    raise _Interrupted(sig)


def _for(seconds: float) -> str:
    return "for good" if seconds == float("inf") else f"{seconds:g}s"


class ElasticLoop:
    def __init__(self, spec: LaunchSpec, settings: ElasticSettings, source: LiveHosts):
        """`spec`: the launch's resolved options (launchspec.py; its HostSource says where the hosts come from
        and which engine reaches them); `settings`: its elastic settings; `source`: the hosts over time."""
        from trainrun.elasticjob.control import ControlServer, SegmentStore

        self.spec, self.settings, self.source, self.origin = spec, settings, source, spec.hosts
        self.book = CooldownBook(settings.cooldown)
        num_proc = spec.plan.num_proc
        if settings.sizing:  # the cap: --max-np, else -np, else every slot there is
            self.np = settings.max_np or num_proc or 1 << 30
        else:
            self.np = num_proc if num_proc is not None else sum(h.slots for h in source.current())
        self.failures: list[FailureRecord] = []
        self.restarts = 0       # restarts after failures (what --max-restarts limits)
        self.attempt = 0        # attempts started so far - 1: TRAINRUN_RESTART_COUNT
        self.control = ControlServer(SegmentStore())  # this machine's ranks' committed-state segment
        self.spares: SparePool | None = None  # this machine's ranks' warm spares (spares.py, --warm-ranks), made by run()
        self.engine: FanoutEngine | None = None  # made with the pool, when an attempt first needs a remote host
        self.pool: AgentPool | None = None
        self.nics: tuple[str, ...] | None = None
        self.local_facts: HostFacts | None = None
        self.current: AttemptHosts | None = None

    # the loop
    def run(self) -> int:
        from trainrun.supervisor import reaper  # noqa: F401  (imported before the fork: the guardian needs it)
        from trainrun.supervisor.watchdog import Watchdog

        caught = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        old = {s: signal.signal(s, _raise_interrupt) for s in caught}
        guard = Watchdog()  # if this launcher is killed, the guardian removes this machine's state segments
        guard.unlink_on_death(self.control.store.prefix)
        if self.settings.warm_ranks:  # the guardian also kills this machine's spares if the launcher dies
            from trainrun.elasticjob.spares import SparePool

            self.spares = SparePool(guard)
        try:
            return self._loop()
        except _Interrupted as it:
            print(f"trainrun: interrupted by {signal.Signals(it.sig).name} between attempts", file=sys.stderr)
            return 128 + it.sig
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            if self.spares is not None:
                self.spares.close()
            if self.pool is not None:
                self.pool.close()
            if self.engine is not None:
                self.engine.close()
            self.control.store.remove()
            guard.close()

    def _loop(self) -> int:
        short_since: float | None = None
        while True:
            self._idle()
            now = time.monotonic()
            pick = pick_hosts(self.source.current(), self.book, now, self.settings, self.np)
            if not pick.hosts:
                short_since = short_since or now
                if now - short_since > self.settings.elastic_timeout:
                    code = self.failures[-1].exit_code if self.failures else 1
                    return self._finish(code, f"not enough hosts for {self.settings.elastic_timeout:g}s: {pick.why}")
                log.info("waiting for hosts: %s", pick.why)
                self._sleep(1.0)
                continue
            short_since = None
            ready = self._agents_for(pick)
            if ready is not True:
                if ready is False:
                    continue
                return ready
            over = self._attempt(pick)
            if over is not None:
                return over

    def _agents_for(self, pick: AttemptHosts) -> bool | int:
        """Agents on every remote host of `pick`. True: ready; False: pick again (with elastic sizing a host
        that cannot be reached sits out; without, it fails the attempt); an int: the job is over, its code."""
        remote = [h for h in pick.hosts if not h.is_local]
        if not remote:
            return True
        if self.pool is None:
            from trainrun.elasticjob.agents import AgentPool
            from trainrun.fanout.select import engine_for

            sup = self.spec.supervision
            self.engine = engine_for(self.spec.reach, self.origin)
            self.pool = AgentPool(self.engine, sup.host_answer, sup.heartbeat_timeout,
                                  warm=self.settings.warm_ranks)
        failed = self.pool.ensure(remote)
        if not failed:
            return True
        if self.attempt == 0 and not self.failures and not self.settings.sizing:
            raise HostsError(list(failed.values()))  # as without --max-restarts: the job never started
        for host, err in failed.items():
            record = FailureRecord(time.time(), self.attempt, host, None, str(err), err.exit_code)
            if self.settings.sizing:
                wait = self.book.fail(host, time.monotonic())
                self.failures.append(replace(record, action=f"{host} sits out " + _for(wait)))
                print(f"trainrun: {err}; {self.failures[-1].action}", file=sys.stderr, flush=True)
                continue
            if not self.settings.restarts_left(self.restarts):
                self.failures.append(replace(record, action="restarts exhausted"))
                return self._finish(err.exit_code, None, f"restarts exhausted after {self.restarts} restart(s)")
            self._sleep(self._restart(record, None))
        return False

    def _attempt(self, pick: AttemptHosts) -> int | None:
        """Run one attempt on `pick`; returns the exit code when the job is over, None to go on."""
        from trainrun.supervisor.assemble import assemble_job
        from trainrun.elasticjob.attempt import AttemptPolicy

        spec = self.spec
        shape = JobShape(pick.hosts, tuple(ranks_per_host(list(pick.hosts), pick.np, spec.plan.oversubscribe)))
        pooled = self.pool.agents if self.pool is not None else {}  # (no pool: every host is this machine)
        agents: dict[str, AgentRanks] = {h.name: pooled[h.name] for h in shape.used if not h.is_local}
        facts = {name: a.facts for name, a in agents.items()}
        if shape.has_local:
            from trainrun.facts.collect import launch_facts

            self.local_facts = self.local_facts or launch_facts()
            facts.update({h.name: self.local_facts for h in shape.used if h.is_local})
        exits = AttemptPolicy()  # how the attempt's exits are judged; what it records is read after the run
        job = assemble_job(spec.plan, spec.supervision, spec.output, shape, agents, facts, self._nics(shape, facts),
                           slurm=self.origin.allocation is not None, attempt=self.attempt, control=self.control,
                           host_updates=self.settings.sizing, spares=self.spares, policy=exits)
        plan = job.plan
        self.control.store.job_id = plan.job.job_id  # names a segment made in this attempt
        self.current = AttemptHosts(tuple(shape.used), len(plan.procs))
        exits.watch_hosts(self._hosts_changed, lambda u: self._notify(u, list(agents.values())))
        result = job.run()
        self.current = None
        size = len(plan.procs)
        if result.interrupted_by is not None:
            return self._finish(result.exit_code, result.summary(size))
        self.attempt += 1
        if result.failure is None and exits.reset:
            log.info("attempt %d: the hosts changed; restarting on them", self.attempt - 1)
            print(f"trainrun: the hosts changed; restarting ({size} rank(s) committed and left)", file=sys.stderr, flush=True)
            return None
        if result.failure is None:
            return self._finish(0, None)
        f = result.failure
        record = FailureRecord(time.time(), self.attempt - 1, exits.failed_host, f.rank, f.what, f.exit_code)
        reason = deterministic(exits.ends, size, job.world_formed)
        if reason is not None:
            self.failures.append(replace(record, action="not restarted: start-up failure on every rank"))
            return self._finish(f.exit_code, result.summary(size), reason)
        if not self.settings.restarts_left(self.restarts):
            self.failures.append(replace(record, action=f"restarts exhausted ({self.restarts} of {self.settings.max_restarts})"))
            return self._finish(f.exit_code, result.summary(size), f"restarts exhausted after {self.restarts} restart(s)")
        self._sleep(self._restart(record, exits.failed_host))
        return None

    def _restart(self, record: FailureRecord, host: str | None) -> float:
        """Count a failure that leads to a restart; cool its host down (elastic sizing). Returns the back-off
        before the restart: none when the failed host sits out (a lost host: the survivors go on at once)."""
        self.restarts += 1
        limit = "" if self.settings.max_restarts is None else f" of {self.settings.max_restarts}"
        sits_out = self.book.fail(host, time.monotonic()) if self.settings.sizing and host is not None else 0.0
        wait = backoff(self.restarts, host_sits_out=sits_out > 0, cap=self.settings.max_backoff)
        capped = 0 < wait < backoff(self.restarts, cap=float("inf"))  # say so: the doubling stopped at the cap
        action = f"restart {self.restarts}{limit} in {wait:g}s" + (" (--max-backoff)" if capped else "")
        if sits_out > 0:
            action += f"; {host} sits out " + _for(sits_out)
            if self.pool is not None and host in self.pool.agents and self.pool.agents[host].lost:
                self.pool.drop(host)
        self.failures.append(replace(record, action=action))
        print(f"trainrun: {record.cause}; {action}", file=sys.stderr, flush=True)
        return wait

    def _hosts_changed(self) -> dict | None:
        """While an attempt runs: would the next one run elsewhere or with more ranks? (the attempt's watch asks)"""
        if self.current is None or not self.settings.sizing:
            return None
        pick = pick_hosts(self.source.current(), self.book, time.monotonic(), self.settings, self.np)
        now_names = {h.name for h in self.current.hosts}
        new_names = {h.name for h in pick.hosts}
        if not pick.hosts or (new_names == now_names and pick.np == self.current.np):
            return None
        if new_names >= now_names and pick.np <= self.current.np:
            return None  # a host came back but cannot add a rank (max-np)
        removed = bool(now_names - new_names)
        log.info("hosts changed: %s -> %s", sorted(now_names), sorted(new_names))
        print(f"trainrun: hosts changed ({', '.join(sorted(now_names))} -> {', '.join(sorted(new_names))}); "
              "telling the ranks to reset at their next commit", file=sys.stderr, flush=True)
        return {"ts": time.time(), "removed": removed}

    def _notify(self, update: dict, agents) -> None:
        self.control.notify(update)
        for agent in agents:
            agent.notify(update)

    def _nics(self, shape: JobShape, facts) -> tuple[str, ...]:
        """The NICs: chosen once; chosen again only when a host lacks them (a host that joined later)."""
        from trainrun.net.choice import choose_nics, nics_present

        if len(shape.used) < 2 or not shape.remote:
            return ()
        if self.nics is None or not nics_present(self.nics, facts):
            self.nics = choose_nics(self.spec.nics, shape.used, self.engine, facts)
        return self.nics

    def _idle(self) -> None:
        if self.pool is not None:
            for host in self.pool.idle():
                log.info("lost the agent on %s between attempts", host)

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(IDLE_TICK, left))
            self._idle()

    def _finish(self, code: int, summary: str | None, reason: str | None = None) -> int:
        lines = [summary] if summary else []
        if reason:
            lines.append(f"trainrun: {reason}")
        if self.failures:
            lines.append(f"trainrun: {len(self.failures)} failure(s) in {self.attempt} attempt(s):")
            lines += [r.line() for r in self.failures]
        if lines:
            print("\n".join(lines), file=sys.stderr, flush=True)
        return code


def run_elastic(spec: LaunchSpec) -> int:
    """An elastic or restartable launch (--max-restarts, --min-np, --host-discovery-script). The hosts of the
    first attempt are the spec's (a discovery script's first answer, run once by the launch step); the script
    runs again from then on (LiveHosts)."""
    assert spec.elastic is not None  # launch() runs this loop for elastic launches only
    ray = spec.hosts.ray  # --ray: the hosts over time are its placement group's
    source = LiveHosts(spec.hosts.hosts, spec.discovery_script, poll=ray.current_hosts if ray is not None else None)
    try:
        if any(h.is_local for h in source.current()):
            from trainrun.plan.program import check_local_program

            check_local_program(spec.plan.command)
        return ElasticLoop(spec, spec.elastic, source).run()
    finally:
        source.close()
