"""Naming the straggler: the ranks' window summaries in, verdicts out (pure; the Job prints them).

Each rank sends, every wire/perf_line.WINDOW_S, how long it was blocked in collectives (WAIT) out of the
window (WALL), how many collectives it ran (COLL) and of how many it was the last rank to join (LAST,
ties counting for each rank in them). A straggler is the rank everyone waits for: it is last to most
collectives, it waits little itself, and the others wait a real share of their time. Per rank and per
host (all its ranks together), over the windows that arrived in the last HORIZON_S:

- last share: the mean over its windows of LAST / COLL (a host: its ranks' LAST summed, at most 1);
  each window weighs alike, so slow windows (fewer collectives) count as much as the fast ones before.
- it is a straggler when its last share >= LAST_SHARE, exceeds the median of the others' by
  LAST_MARGIN (ties: in a balanced job several ranks often join the same round, every one of them
  "last", so only a share well above the others' means anything), the others' median wait share is
  >= WAIT_SHARE (below that the slow rank costs the job little: not worth a line), and its own wait
  share is at most OWN_WAIT_FACTOR times the others' (the slow rank is the one that does not wait).
- a host is named instead of a rank when every rank of a multi-rank host passes the wait test and
  the host together passes the share test, against the other hosts' shares (each host's ranks
  summed): a slow host slows all its ranks, of which one is last.
- it has recovered when it no longer passes with the RECOVER_* (looser) thresholds: hysteresis, so a
  borderline rank does not flap.
Each rank's first window is dropped (it holds start-up: ranks import and build models at different
speeds, and wait for each other in the first broadcasts), and every rank must have MIN_WINDOWS
windows in the horizon before any verdict.

Where the straggler loses its time: its compute (wall minus blocked time) splits into the time before
each optimizer step (BEFORE: from the end of one step to the next backward's first gradient, i.e. data
loading and the forward pass) and the rest (backward, optimizer, whatever runs inside the step). If its
excess over the others' median is mostly (WHERE_FACTOR times the other part) before the step, the line
says "before the step (data loading or the forward pass)"; mostly inside, "inside the step (compute)".
The runtime cannot tell the loader from the forward pass: neither calls it. Without an optimizer
(steps unknown) nothing is said.
"""
from __future__ import annotations

import json
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

HORIZON_S = 30.0
LAST_SHARE = 0.6
LAST_MARGIN = 0.3
WAIT_SHARE = 0.10
OWN_WAIT_FACTOR = 0.5
RECOVER_LAST_SHARE = 0.45
RECOVER_WAIT_SHARE = 0.05
MIN_WINDOWS = 2  # per rank in the horizon: one window of a loaded machine's noise is not a verdict
WHERE_FACTOR = 2.0
MIN_COLLECTIVES = 5  # per rank in the horizon: fewer says nothing about who is last


@dataclass(frozen=True)
class Window:
    """One rank's window summary (wire/perf_line.py), stamped with the launcher's clock on arrival."""
    rank: int
    at: float
    wall_ms: int
    wait_ms: int
    collectives: int
    last: int
    steps: int  # optimizer steps; negative: blocking waits, without an optimizer
    before_ms: int = 0
    reduced_bytes: int = 0  # allreduce payload (0 from ranks that do not send it)
    rss_mb: int = 0         # the rank's memory when it sent the window
    gpu_mb: int = 0

    @classmethod
    def parse(cls, rank: int, text: str, at: float) -> Window | None:
        try:
            fields = [int(x) for x in text.split()]
            wall, wait, coll, last, steps = fields[:5]
        except ValueError:
            return None
        extra = (fields[5:] + [0] * 4)[:4]  # before_ms, bytes, rss, gpu: absent from older ranks' lines
        return cls(rank, at, wall, wait, coll, last, steps, *extra) if wall > 0 else None

    @property
    def text(self) -> str:
        """The window as its perf line's fields (what parse reads)."""
        return (f"{self.wall_ms} {self.wait_ms} {self.collectives} {self.last} {self.steps} {self.before_ms} "
                f"{self.reduced_bytes} {self.rss_mb} {self.gpu_mb}")


@dataclass(frozen=True)
class Stats:
    """A rank's (or a host's) figures over the horizon."""
    last_share: float
    wait_share: float
    compute_ms: float  # blocked time subtracted: compute, data loading included
    collectives: int
    steps: int
    before_ms: float = 0.0  # of compute_ms: before the optimizer steps (0 without one)


@dataclass(frozen=True)
class StragglerVerdict:
    """`who`: the rank(s) named, all of one host; `host` set when the whole host is named."""
    ranks: tuple[int, ...]
    host: str | None
    last_share: float      # of the named rank or host
    others_wait: float     # the others' median wait share
    compute_ratio: float   # its compute time over the others' median (inf when theirs is 0)
    span_s: float          # the time the windows cover
    where: str = ""        # "before" the step (loader, forward), "inside" it, or "" (unknown)


def rank_stats(windows) -> Stats | None:
    ws = list(windows)
    coll = sum(w.collectives for w in ws)
    if not ws or coll < MIN_COLLECTIVES:
        return None
    shares = [min(1.0, w.last / w.collectives) for w in ws if w.collectives > 0]
    wall = sum(w.wall_ms for w in ws)
    wait = sum(w.wait_ms for w in ws)
    return Stats(sum(shares) / len(shares) if shares else 0.0, wait / wall if wall else 0.0, float(wall - wait),
                 coll, sum(abs(w.steps) for w in ws) if all(w.steps > 0 for w in ws) else 0,
                 float(sum(w.before_ms for w in ws)))


def _by_host(stats: dict[int, Stats], hosts: dict[int, str]) -> dict[str, list[int]]:
    by_host: dict[str, list[int]] = {}
    for r in sorted(stats):
        by_host.setdefault(hosts.get(r, "?"), []).append(r)
    return by_host


def shortfalls(group: list[int], stats: dict[int, Stats], by_host: dict[str, list[int]]) -> dict[str, float] | None:
    """How far `group` (one rank, or one host's ranks) is from each condition of the rule, in share
    points: > 0 fails that condition, <= 0 passes it; named when every one passes. None without others.
    Also the figures the verdict line shows (share, others_wait)."""
    others = [r for r in stats if r not in group]
    if not others:
        return None
    share = min(1.0, sum(stats[r].last_share for r in group))
    if len(group) > 1:  # a host against the other hosts, each its ranks together
        others_share = statistics.median(min(1.0, sum(stats[r].last_share for r in g))
                                         for h, g in by_host.items() if g != group)
    else:
        others_share = statistics.median(stats[r].last_share for r in others)
    others_wait = statistics.median(stats[r].wait_share for r in others)
    own_wait = max(stats[r].wait_share for r in group)
    return {"share": share, "others_share": others_share, "others_wait": others_wait, "own_wait": own_wait,
            "last_share": LAST_SHARE - share, "last_margin": LAST_MARGIN - (share - others_share),
            "wait_share": WAIT_SHARE - others_wait, "own_wait_factor": own_wait - OWN_WAIT_FACTOR * others_wait}


RULE = ("last_share", "last_margin", "wait_share", "own_wait_factor")


def candidates(stats: dict[int, Stats], hosts: dict[int, str]) -> list[list[int]]:
    """The groups the rule tests, in its order: each multi-rank host (when there are several hosts),
    then the rank with the highest last share."""
    by_host = _by_host(stats, hosts)
    out = [g for g in by_host.values() if len(g) > 1] if len(by_host) > 1 else []
    return out + [[max(stats, key=lambda r: stats[r].last_share)]]


def judge(stats: dict[int, Stats], hosts: dict[int, str], current: StragglerVerdict | None, span_s: float) -> StragglerVerdict | None:
    """The straggler among ranks with `stats` (rank -> host in `hosts`), or None. `current`: the one
    named now, judged with the looser RECOVER_* thresholds."""
    if len(stats) < 2:
        return None
    by_host = _by_host(stats, hosts)

    def test(group: list[int], loose: bool) -> StragglerVerdict | None:
        f = shortfalls(group, stats, by_host)
        if f is None:
            return None
        if loose:
            if f["share"] < RECOVER_LAST_SHARE or f["others_wait"] < RECOVER_WAIT_SHARE:
                return None
        elif max(f[k] for k in RULE) > 0:
            return None
        others = [r for r in stats if r not in group]
        mine = statistics.mean(stats[r].compute_ms for r in group)
        theirs = statistics.median(stats[r].compute_ms for r in others)
        host = hosts.get(group[0]) if len(group) > 1 else None
        return StragglerVerdict(tuple(group), host, f["share"], f["others_wait"],
                       mine / theirs if theirs > 0 else float("inf"), span_s, where_lost(group, others, stats))

    if current is not None:  # still there?
        return test(list(current.ranks), loose=True)
    for group in candidates(stats, hosts):
        v = test(group, loose=False)
        if v is not None:
            return v
    return None


@dataclass(frozen=True)
class Slack:
    """How close a healthy job came to a verdict at one evaluation: the candidate nearest to being named
    and, for it, the largest shortfall over the rule's conditions (every one must pass to name it: this
    is how much the binding one must still move, in share points). > 0: no verdict."""
    slack: float
    ranks: tuple[int, ...]
    binding: str            # the condition with that shortfall (RULE)
    figures: dict


def closest(stats: dict[int, Stats], hosts: dict[int, str]) -> Slack | None:
    """The rule's margin now (see Slack); None with fewer than two ranks."""
    if len(stats) < 2:
        return None
    by_host = _by_host(stats, hosts)
    best = None
    for group in candidates(stats, hosts):
        f = shortfalls(group, stats, by_host)
        if f is None:
            continue
        binding = max(RULE, key=lambda k: f[k])
        if best is None or f[binding] < best.slack:
            best = Slack(f[binding], tuple(group), binding, {k: round(v, 4) for k, v in f.items()})
    return best


def where_lost(group: list[int], others: list[int], stats: dict[int, Stats]) -> str:
    """'before' or 'inside' the step: where `group`'s compute exceeds the others' (see the module docstring)."""
    if any(stats[r].steps <= 0 for r in group + others):
        return ""
    per_step = {r: (stats[r].before_ms / stats[r].steps, (stats[r].compute_ms - stats[r].before_ms) / stats[r].steps)
                for r in group + others}
    d_before = statistics.mean(per_step[r][0] for r in group) - statistics.median(per_step[r][0] for r in others)
    d_inside = statistics.mean(per_step[r][1] for r in group) - statistics.median(per_step[r][1] for r in others)
    if d_before > 0 and d_before >= WHERE_FACTOR * max(d_inside, 0.0):
        return "before"
    if d_inside > 0 and d_inside >= WHERE_FACTOR * max(d_before, 0.0):
        return "inside"
    return ""


WHERE_WORDS = {"before": "its time goes before the step (data loading or the forward pass)",
               "inside": "its time goes inside the step (compute: backward, optimizer)"}


def describe(v: StragglerVerdict, hosts: dict[int, str]) -> str:
    """The line printed when `v` is first seen (without the 'trainrun: ' prefix)."""
    if v.host is not None:
        who = f"host {v.host} (ranks {', '.join(map(str, v.ranks))})"
        was = "its ranks were"
    else:
        who = f"rank {v.ranks[0]} on {hosts.get(v.ranks[0], '?')}"
        was = "it was"
    ratio = "" if v.compute_ratio == float("inf") else f" (compute {v.compute_ratio:.1f}x the median)"
    where = f"; {WHERE_WORDS[v.where]}" if v.where else ""
    return (f"straggler: {who}: {was} last to {v.last_share:.0%} of collectives in the last {v.span_s:.0f} s; "
            f"the other ranks waited {v.others_wait:.0%} of their time for it{ratio}{where}")


def recovered(v: StragglerVerdict, hosts: dict[int, str]) -> str:
    who = f"host {v.host}" if v.host is not None else f"rank {v.ranks[0]} on {hosts.get(v.ranks[0], '?')}"
    return f"straggler: {who} keeps up again"


@dataclass
class Watch:
    """The Job's straggler state: `on_window` takes each window and returns the lines to print
    (a straggler named, or recovered); `summary()` the end-of-job lines (only if one was seen)."""
    hosts: dict[int, str]
    windows: dict[int, deque] = field(default_factory=dict)
    started: set = field(default_factory=set)  # ranks whose first (start-up) window was dropped
    current: StragglerVerdict | None = None
    seen: list[StragglerVerdict] = field(default_factory=list)
    totals: dict[int, list] = field(default_factory=dict)  # rank -> [wall_ms, wait_ms, coll, last]
    lowest: Slack | None = None  # the rule's smallest margin seen while no straggler was named (closest())
    # supervisor/monitor.Monitor (--monitor, --json): told every window, verdict and the summary; and
    # text_lines False (--json): the verdict and summary lines go to it alone, not returned for printing
    listener: Any = None
    text_lines: bool = True

    def on_window(self, rank: int, text: str, now: float) -> list[str]:
        w = Window.parse(rank, text, now)
        if w is None:
            return []
        self._tell("on_window", w)
        if rank not in self.started:
            self.started.add(rank)
            return []
        self.windows.setdefault(rank, deque()).append(w)
        t = self.totals.setdefault(rank, [0, 0, 0, 0])
        t[0] += w.wall_ms
        t[1] += w.wait_ms
        t[2] += w.collectives
        t[3] += w.last
        return self.evaluate(now)

    def record(self, rank: int, text: str, wall_time: float) -> str | None:
        """The JSON line for `--output-dir`'s straggler.jsonl: one rank's window and the straggler named
        at that moment (its ranks, or null); None for a line that does not parse."""
        w = Window.parse(rank, text, 0.0)
        if w is None:
            return None
        return json.dumps({"time": round(wall_time, 3), "rank": rank, "host": self.hosts.get(rank), "wall_ms": w.wall_ms,
                           "wait_ms": w.wait_ms, "collectives": w.collectives, "last": w.last, "steps": w.steps,
                           "before_ms": w.before_ms, "bytes": w.reduced_bytes, "rss_mb": w.rss_mb, "gpu_mb": w.gpu_mb,
                           "straggler": list(self.current.ranks) if self.current else None})

    def evaluate(self, now: float) -> list[str]:
        for q in self.windows.values():
            while q and q[0].at < now - HORIZON_S:
                q.popleft()
        if len(self.windows) < len(self.hosts) or any(len(q) < MIN_WINDOWS for q in self.windows.values()):
            return []
        stats = {r: s for r, q in self.windows.items() if (s := rank_stats(q)) is not None}
        if len(stats) < len(self.hosts):
            return []
        oldest = min(q[0].at - q[0].wall_ms / 1000 for q in self.windows.values())
        v = judge(stats, self.hosts, self.current, min(HORIZON_S, now - oldest))
        if v is None and self.current is None:
            m = closest(stats, self.hosts)
            if m is not None and (self.lowest is None or m.slack < self.lowest.slack):
                self.lowest = m
        out = []
        if self.current is not None and v is None:
            out.append(recovered(self.current, self.hosts))
            self._tell("on_verdict", self.current, out[-1], True)
            self.current = None
        elif self.current is None and v is not None:
            self.current = v
            self.seen.append(v)
            out.append(describe(v, self.hosts))
            self._tell("on_verdict", v, out[-1], False)
        return out if self.text_lines else []

    def _tell(self, what: str, *args) -> None:
        """Call the listener; one that fails is dropped (a view must not end the detection, nor the job)."""
        if self.listener is None:
            return
        try:
            getattr(self.listener, what)(*args)
        except Exception as err:
            from trainrun import log

            log.info("straggler listener dropped: %s: %s", type(err).__name__, err)
            listener, self.listener = self.listener, None
            try:
                listener.close()
            except Exception:  # (it failed already: nothing more to save)
                pass

    def ranking(self, limit: int = 3) -> list[dict]:
        """The slowest ranks over the whole job: last share and compute share of wall time, highest first."""
        share = {r: (t[3] / t[2] if t[2] else 0.0, 1 - (t[1] / t[0] if t[0] else 0.0)) for r, t in self.totals.items()}
        ranks = sorted(share, key=lambda r: share[r], reverse=True)[:limit]
        return [{"rank": r, "host": self.hosts.get(r), "last_share": round(share[r][0], 4),
                 "compute_share": round(share[r][1], 4)} for r in ranks]

    def summary(self, limit: int = 3) -> list[str]:
        """The slowest ranks and hosts over the whole job, with advice; empty if no straggler was seen.
        Called when the job ends: the listener is told (and closed first, so that a live view is done
        before the lines print); with text_lines False it alone gets them."""
        if self.listener is not None:
            self._tell("close")
        lines = self._summary(limit)
        if self.listener is not None:
            self._tell("on_summary", lines, self.ranking(limit) if lines else [])
        return lines if self.text_lines else []

    def _summary(self, limit: int) -> list[str]:
        if not self.seen:
            return []
        share = {r: (t[3] / t[2] if t[2] else 0.0, 1 - (t[1] / t[0] if t[0] else 0.0)) for r, t in self.totals.items()}
        ranks = sorted(share, key=lambda r: share[r], reverse=True)[:limit]
        host_of = self.hosts
        lines = ["straggler summary (last share, compute share of wall time, over the whole job): " + ", ".join(
            f"rank {r} on {host_of.get(r, '?')} {share[r][0]:.0%} / {share[r][1]:.0%}" for r in ranks)]
        one_host = len(set(host_of.values())) == 1
        named = {v.host or host_of.get(v.ranks[0], "?") for v in self.seen}
        for h in sorted(named):
            whom = [f"rank {v.ranks[0]}" for v in self.seen if v.host is None and host_of.get(v.ranks[0]) == h]
            who = " and ".join(sorted(set(whom))) + f" on {h}" if whom and (one_host or not any(
                v.host == h for v in self.seen)) else h
            if one_host:  # nothing to leave out: the rank itself is slower (its data, its share of the cores)
                lines.append(f"straggler: {who} held the job back; `trainrun --check --perf` measures the host's compute")
            else:
                lines.append(f"straggler: {who} held the job back; compare the hosts with `trainrun --check --perf`, "
                             f"or leave it out with `--exclude {h}`")
        return lines


def replay(records) -> Watch:
    """A Watch fed the windows of --output-dir's straggler.jsonl records (dicts, in file order), on their
    wall-clock stamps: what the launcher saw, for margins after the fact (scripts/straggler_healthy.py)."""
    records = list(records)
    w = Watch({r["rank"]: r["host"] for r in records})
    for r in records:
        win = Window(r["rank"], r["time"], r["wall_ms"], r["wait_ms"], r["collectives"], r["last"], r["steps"],
                     r.get("before_ms", 0), r.get("bytes", 0), r.get("rss_mb", 0), r.get("gpu_mb", 0))
        w.on_window(r["rank"], win.text, r["time"])
    return w
