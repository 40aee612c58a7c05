"""The elastic loop's decisions, pure (no processes, no clock of its own: `now` is passed in).

    ElasticSettings    the elastic options of a launch (--max-restarts, --min-np, --max-np, discovery, cool-down,
                       --max-backoff)
    CooldownBook       which hosts failed and until when they sit out (growing cool-downs)
    pick_hosts         the hosts and rank count of the next attempt, or why there are not enough
    deterministic      did every rank fail the same way at start-up (then a restart cannot help)
    backoff            seconds to wait before restart number n
    FailureRecord      one line of the summary of a restarted job (time, host, rank, cause, action)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainrun.plan.hosts import HostSpec

BACKOFF_FIRST = 0.5   # seconds before the first restart; doubles with each failure
DEFAULT_MAX_BACKOFF = 10.0
"""--max-backoff's default: the most seconds the back-off grows to (0.5, 1, 2, 4, 8, then 10 s). The back-off
keeps a failing job from restarting in a tight loop and lets a short fault (a port still in TIME_WAIT, a
file system hiccup) pass; 10 s does both, while each further second is a second every rank of the job sits
idle per failure. A fault that lasts longer is a host's, which the cool-down (--blacklist-cooldown-range)
and --max-restarts deal with. config.LaunchConfig.max_backoff repeats this value (the config layer does
not import this module at start-up; tests/unit/test_elastic_policy.py checks that the two agree)."""
STARTUP_WINDOW = 10.0  # seconds: failures this soon after the start (and before the MPI world formed) are start-up failures


@dataclass(frozen=True)
class ElasticSettings:
    """`max_restarts` None: no limit (elastic sizing without --max-restarts: a failing host is cooled down
    instead, and the job ends when fewer than min_np slots stay available for `elastic_timeout` s).
    `cooldown` None: a failed host never comes back (Horovod's default)."""

    max_restarts: int | None = 0
    min_np: int | None = None
    max_np: int | None = None
    discovery_script: str | None = None
    cooldown: tuple[float, float] | None = None
    elastic_timeout: float = 600.0
    warm_ranks: bool = True  # a spare interpreter per rank for the next attempt (elasticjob/spares.py)
    max_backoff: float = DEFAULT_MAX_BACKOFF  # --max-backoff: the cap of the back-off before a restart (backoff())

    @property
    def sizing(self) -> bool:
        """The job may change size (shrink onto the hosts left, grow onto hosts that come back)."""
        return self.min_np is not None or self.discovery_script is not None

    @property
    def enabled(self) -> bool:
        return self.sizing or (self.max_restarts or 0) > 0 or self.max_restarts is None

    def restarts_left(self, failures: int) -> bool:
        return self.max_restarts is None or failures < self.max_restarts

    def describe(self) -> str:
        """One line for --dry-run and --check."""
        parts = [f"max-restarts {'unlimited' if self.max_restarts is None else self.max_restarts}"]
        if self.sizing:
            parts.append(f"np {self.min_np or 1}..{self.max_np or 'slots'}")
            parts.append(f"hosts from {self.discovery_script}" if self.discovery_script else "hosts fixed (shrink onto the hosts left)")
            if self.cooldown:
                parts.append(f"failed hosts sit out {self.cooldown[0]:g}..{self.cooldown[1]:g} s (doubling)")
            else:
                parts.append("failed hosts are not used again")
            parts.append(f"gives up after {self.elastic_timeout:g} s below min-np")
        parts.append(self._describe_backoff())
        parts.append("warm ranks (a spare per rank)" if self.warm_ranks else "no warm ranks")
        return "elastic: " + ", ".join(parts)

    def _describe_backoff(self) -> str:
        cap = self.max_backoff
        if cap == 0:
            return "no back-off"
        return f"back-off {cap:g} s" if cap <= BACKOFF_FIRST else f"back-off {BACKOFF_FIRST:g} s doubling up to {cap:g} s"

    def to_json(self) -> dict:
        return {"max_restarts": self.max_restarts, "min_np": self.min_np, "max_np": self.max_np,
                "host_discovery_script": self.discovery_script,
                "blacklist_cooldown_range": list(self.cooldown) if self.cooldown else None,
                "elastic_timeout": self.elastic_timeout, "warm_ranks": self.warm_ranks, "max_backoff": self.max_backoff}


def cooldown_for(failures: int, cooldown: tuple[float, float] | None) -> float:
    """Seconds a host sits out after its `failures`-th failure: MIN, 2 MIN, 4 MIN, ... capped at MAX;
    forever (inf) without a cool-down range."""
    if cooldown is None:
        return math.inf
    low, high = cooldown
    return min(high, low * 2 ** (failures - 1))


@dataclass
class CooldownBook:
    """Failed hosts and the time (on the caller's clock) until which each sits out."""

    cooldown: tuple[float, float] | None = None
    failures: dict[str, int] = field(default_factory=dict)
    until: dict[str, float] = field(default_factory=dict)

    def fail(self, host: str, now: float) -> float:
        """Record a failure of `host`; returns how long it now sits out."""
        n = self.failures[host] = self.failures.get(host, 0) + 1
        wait = cooldown_for(n, self.cooldown)
        self.until[host] = now + wait
        return wait

    def available(self, host: str, now: float) -> bool:
        return now >= self.until.get(host, -math.inf)


@dataclass(frozen=True)
class AttemptHosts:
    """The next attempt's hosts (in the given order) and rank count; `hosts` empty: not enough slots."""

    hosts: tuple[HostSpec, ...]
    np: int
    why: str = ""


def pick_hosts(candidates: list[HostSpec], book: CooldownBook, now: float, settings: ElasticSettings, np: int) -> AttemptHosts:
    """The hosts an attempt runs on. Without elastic sizing: all candidates, `np` ranks (as the first
    attempt). With it (`np` is then the cap: --max-np, else -np): the candidates not sitting out,
    min(np, their slots) ranks filled in order (hosts left without a rank are not used), or an empty AttemptHosts
    when that is below min-np."""
    if not settings.sizing:
        return AttemptHosts(tuple(candidates), np)
    usable = [h for h in candidates if book.available(h.name, now)]
    slots = sum(h.slots for h in usable)
    want = min(np, slots)
    if want < (settings.min_np or 1):
        return AttemptHosts((), 0, f"{slots} slot(s) available on {len(usable)} host(s), --min-np is {settings.min_np or 1}")
    hosts, filled = [], 0
    for h in usable:
        if filled >= want:
            break
        hosts.append(h)
        filled += h.slots
    return AttemptHosts(tuple(hosts), want)


def backoff(failures: int, host_sits_out: bool = False, cap: float = DEFAULT_MAX_BACKOFF) -> float:
    """Seconds before the restart that follows the `failures`-th failure: BACKOFF_FIRST, doubling with each
    failure, never more than `cap` (--max-backoff; 0: restart at once). None when the failure was a host's
    and that host sits the next attempt out (`host_sits_out`, elastic sizing): the back-off keeps a failure
    from repeating at once on the same hosts, and the survivors, none of which failed, run without it."""
    if host_sits_out:
        return 0.0
    return min(cap, BACKOFF_FIRST * 2 ** min(max(0, failures - 1), 64))  # 2**64 half-seconds: beyond any cap


@dataclass(frozen=True)
class RankEnd:
    """How one rank of an attempt ended: return code, seconds after the attempt started, last stderr line."""

    rank: int
    returncode: int
    after: float
    last_line: str = ""


def deterministic(ends: list[RankEnd], size: int, world_formed: bool) -> str | None:
    """A reason line when every rank failed the same way at start-up (same exit code and last stderr line,
    none killed by a signal or lost, before the MPI world formed and within STARTUP_WINDOW s): an import
    error or a bad argument, which a restart would only repeat. None otherwise."""
    if world_formed or len(ends) < size or size == 0:
        return None
    codes = {e.returncode for e in ends}
    lines = {e.last_line for e in ends}
    if len(codes) != 1 or len(lines) != 1:
        return None
    code = next(iter(codes))
    if code <= 0 or code == 255 or any(e.after > STARTUP_WINDOW for e in ends):
        return None
    last = next(iter(lines))
    what = f" ({last})" if last else ""
    return (f"every rank ({size}) exited with code {code} within {max(e.after for e in ends):.1f}s of starting{what}; "
            "a restart would fail the same way, so the job ends here")


@dataclass(frozen=True)
class FailureRecord:
    """One failure of a restarted job and what was done about it."""

    when: float           # wall-clock time (time.time())
    attempt: int
    host: str | None
    rank: int | None
    cause: str
    exit_code: int
    action: str = ""

    def line(self) -> str:
        import time

        stamp = time.strftime("%H:%M:%S", time.localtime(self.when))
        return f"  {stamp} attempt {self.attempt}: {self.cause} -> {self.action}"
