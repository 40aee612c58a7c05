"""What `--check --perf` measured, and the verdict on it: outliers against the median, and what to do. Pure.

Rules (the thresholds are module constants; docs/benchmarks/perf_check.md says why they hold on a noisy box):

- link: per NIC, each host's median bandwidth over its links (both directions) is compared with the median
  of those host medians (the reference). A host under LINK_FRACTION of it is the slow end of all its links
  ("exclude h2"); a single link under LINK_FRACTION of it, between hosts that are otherwise fine, is a cable
  or switch port. With two hosts there is one link and no reference: nothing is named.
- compute: a host under COMPUTE_FRACTION of the median host's GFLOP/s; a GPU held by another process.
- sameness: a version that differs between hosts names the hosts that differ from the majority.
- clock: an offset beyond CLOCK_WARN_S (after subtracting the measurement's own uncertainty) is a warning:
  it skews logs and timelines, not speed. A collective far below the slowest link is a note, not a verdict.

A finding `degrades` when the job would run slower (or not the same way) on every host because of it; only
those set `--perf-strict`'s exit code.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

LINK_FRACTION = 0.5
COMPUTE_FRACTION = 0.7
CLOCK_WARN_S = 0.1
COLLECTIVE_NOTE_FRACTION = 0.25
# the sameness table's rows: (label, HostFacts field)
VERSION_FIELDS = (("Python", "python_version"), ("trainrun", "trainrun"), ("numpy", "numpy"), ("mpi4py", "mpi4py"),
                  ("MPI", "mpi"), ("torch", "torch"), ("TensorFlow", "tensorflow"), ("CUDA driver", "cuda_driver"),
                  ("NCCL", "nccl"))


@dataclass(frozen=True)
class LinkSample:
    """One direction of one link on one NIC: `src` sent, `dst` received. `mbps` None when it failed."""

    nic: str
    src: str
    dst: str
    mbps: float | None
    rtt_us: float | None = None
    error: str = ""
    readings: tuple[float, ...] = ()   # every reading of this direction when it was measured again (best counts)


@dataclass(frozen=True)
class HostSample:
    host: str
    gflops: float | None
    load1: float = 0.0
    mem_avail_mib: int = 0
    cpus: int = 0
    gpus: tuple = ()            # gpu_state rows (net/linkbench.py)
    clock_offset_ms: float | None = None   # host clock minus the launcher's
    clock_error_ms: float | None = None    # half the round trip it was measured over
    error: str = ""


@dataclass(frozen=True)
class CollectiveSample:
    size_bytes: int
    seconds: float              # per allreduce (median of the iterations)
    busbw_mbps: float           # nccl-tests' bus bandwidth: 2 (n-1)/n * size / time


@dataclass(frozen=True)
class Finding:
    kind: str                   # link, host, compute, gpu, version, clock, collective
    subject: str                # what is named: "h2 eth1", "h1<->h3 eth1", "h3", "numpy"
    message: str
    advice: str = ""
    degrades: bool = True
    exclude: tuple[str, ...] = ()   # hosts whose exclusion is the advice


@dataclass
class PerfResult:
    hosts: list[str]
    nics: list[str]
    links: list[LinkSample] = field(default_factory=list)
    host_samples: list[HostSample] = field(default_factory=list)
    versions: dict = field(default_factory=dict)       # {label: {host: value}}
    collective: list[CollectiveSample] = field(default_factory=list)
    collective_error: str = ""
    rounds: int = 0
    seconds_per_direction: float = 0.0
    wall_s: float = 0.0
    phases: dict = field(default_factory=dict)       # {phase: seconds}: start, clocks, compute, links, collective
    skipped: list[str] = field(default_factory=list)  # what the budget or a failure left out
    collective_nic: str = ""    # the NIC the collective's launch names first (--network-interface); "": nics[0]


def round_robin(hosts: list[str]) -> list[list[tuple[str, str]]]:
    """Rounds of disjoint pairs covering every pair once (the circle method): N-1 rounds of N/2 pairs for even
    N, N rounds of (N-1)/2 for odd N (one host sits out each round)."""
    ring = list(hosts) + ([None] if len(hosts) % 2 else [])
    n, rounds = len(ring), []
    for _ in range(n - 1):
        pairs = [(ring[i], ring[n - 1 - i]) for i in range(n // 2)]
        rounds.append([(a, b) for a, b in pairs if a is not None and b is not None])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


def link_matrix(links: list[LinkSample], nic: str) -> dict[tuple[str, str], LinkSample]:
    return {(s.src, s.dst): s for s in links if s.nic == nic}


def link_reference(links: list[LinkSample], nic: str, hosts: list[str]) -> tuple[float | None, dict[str, float]]:
    """(reference bandwidth, {host: median of its links}) for one NIC; reference None below 3 hosts."""
    m = link_matrix(links, nic)
    per_host = {}
    for h in hosts:
        vals = [s.mbps for (a, b), s in m.items() if h in (a, b) and s.mbps is not None]
        if vals:
            per_host[h] = statistics.median(vals)
    if len(per_host) < 3:
        return None, per_host
    return statistics.median(per_host.values()), per_host


def suspect_pairs(links: list[LinkSample], nics: list[str], hosts: list[str]) -> list[tuple[str, str, str]]:
    """(nic, a, b) of the links the verdict would name on these readings, each pair once: what to measure
    again alone before judging. That is every link of a host under the host rule (its median: links that
    are each above LINK_FRACTION can still make one under it), every single link under LINK_FRACTION of its
    NIC's reference, and every failed link. Slow hosts' links come first."""
    out: list[tuple[str, str, str]] = []

    def add(nic: str, a: str, b: str) -> None:
        if (nic, a, b) not in out and (nic, b, a) not in out:
            out.append((nic, a, b))

    for nic in nics:
        ref, per_host = link_reference(links, nic, hosts)
        m = link_matrix(links, nic)
        if ref is not None:
            for h in sorted((h for h, v in per_host.items() if v < LINK_FRACTION * ref), key=lambda h: per_host[h]):
                for (a, b) in m:
                    if h in (a, b):
                        add(nic, a, b)
        for (a, b), s in m.items():
            if s.mbps is None or (ref is not None and s.mbps < LINK_FRACTION * ref):
                add(nic, a, b)
    return out


def _fmt_mbps(v: float) -> str:
    return f"{v / 1000:.2f} Gb/s" if v >= 1000 else f"{v:.0f} Mb/s"


def link_findings(r: PerfResult) -> list[Finding]:
    out = []
    for nic in r.nics:
        m = link_matrix(r.links, nic)
        for (a, b), s in sorted(m.items()):
            if s.mbps is None:
                out.append(Finding("link", f"{a}->{b} {nic}", f"{a} -> {b} on {nic}: measurement failed ({s.error})",
                                   f"check {nic} between {a} and {b}"))
        ref, per_host = link_reference(r.links, nic, r.hosts)
        if ref is None:
            continue
        slow_hosts = [h for h, v in per_host.items() if v < LINK_FRACTION * ref]
        for h in slow_hosts:
            out.append(Finding("link", f"{h} {nic}",
                               f"{h} {nic}: its links run at {_fmt_mbps(per_host[h])} (median), "
                               f"{per_host[h] / ref:.0%} of the others' {_fmt_mbps(ref)}",
                               f"check {h}'s {nic} (cable, port speed, shaping), or exclude it: --exclude {h}", exclude=(h,)))
        seen = set()
        for (a, b), s in sorted(m.items()):
            pair = frozenset((a, b))
            if s.mbps is None or a in slow_hosts or b in slow_hosts or pair in seen or s.mbps >= LINK_FRACTION * ref:
                continue
            seen.add(pair)
            out.append(Finding("link", f"{a}<->{b} {nic}",
                               f"{a} -> {b} on {nic}: {_fmt_mbps(s.mbps)}, {s.mbps / ref:.0%} of the median {_fmt_mbps(ref)}",
                               f"check the path between {a} and {b} on {nic} (cable, switch port)"))
    return out


def compute_findings(r: PerfResult) -> list[Finding]:
    out = []
    measured = [(s, s.gflops) for s in r.host_samples if s.gflops is not None]
    for s in r.host_samples:
        if s.error:
            out.append(Finding("compute", s.host, f"{s.host}: compute probe failed ({s.error})", "", exclude=(s.host,)))
    if len(measured) >= 2:
        med = statistics.median(gflops for _, gflops in measured)
        for s, gflops in measured:
            if gflops < COMPUTE_FRACTION * med:
                out.append(Finding("compute", s.host,
                                   f"{s.host}: {gflops:.1f} GFLOP/s, {gflops / med:.0%} of the median {med:.1f} "
                                   f"(load {s.load1:.1f} on {s.cpus} CPU(s))",
                                   f"find what else runs on {s.host}, or exclude it: --exclude {s.host}", exclude=(s.host,)))
    for s in r.host_samples:
        for g in s.gpus:
            if g.get("procs"):
                out.append(Finding("gpu", f"{s.host}:{g['index']}",
                                   f"{s.host} GPU {g['index']}: held by {g['procs']} other process(es), "
                                   f"{g.get('mem_free_mib', 0)} MiB free",
                                   f"stop them, or exclude the GPU: --exclude {s.host}:{g['index']}"))
    return out


def version_findings(r: PerfResult) -> list[Finding]:
    out = []
    for label, by_host in r.versions.items():
        values = list(by_host.values())
        if len(set(values)) < 2:
            continue
        common = max(set(values), key=values.count)
        odd = [h for h, v in by_host.items() if v != common]
        there = ", ".join(f"{h}: {by_host[h] or 'missing'}" for h in odd)
        out.append(Finding("version", label, f"{label} differs: {there}; the others have {common or 'none'}",
                           f"install {label} {common} on {', '.join(odd)}, or exclude: --exclude {','.join(odd)}"
                           if common else f"remove {label} from {', '.join(odd)} or install it everywhere",
                           exclude=tuple(odd)))
    return out


def clock_findings(r: PerfResult) -> list[Finding]:
    out = []
    for s in r.host_samples:
        if s.clock_offset_ms is None:
            continue
        beyond = abs(s.clock_offset_ms) - (s.clock_error_ms or 0)
        if beyond > CLOCK_WARN_S * 1000:
            out.append(Finding("clock", s.host, f"{s.host}: clock {s.clock_offset_ms:+.0f} ms from this machine's",
                               f"run NTP/chrony on {s.host}", degrades=False))
    return out


def collective_findings(r: PerfResult) -> list[Finding]:
    slowest = collective_prediction(r)
    if not r.collective or not slowest:
        return []
    best = max(c.busbw_mbps for c in r.collective)
    if best >= COLLECTIVE_NOTE_FRACTION * slowest:
        return []
    return [Finding("collective", "allreduce",
                    f"allreduce bus bandwidth {_fmt_mbps(best)} is {best / slowest:.0%} of the slowest link's "
                    f"{_fmt_mbps(slowest)} on {prediction_nic(r)}",
                    "the MPI may use another NIC than measured, or the hosts' CPUs limit it", degrades=False)]


def findings(r: PerfResult) -> list[Finding]:
    return link_findings(r) + compute_findings(r) + version_findings(r) + clock_findings(r) + collective_findings(r)


def degraded(found: list[Finding]) -> bool:
    return any(f.degrades for f in found)


def exclude_advice(found: list[Finding]) -> str:
    """One flag that applies every exclusion the findings advise ("" when none)."""
    hosts = []
    for f in found:
        for h in f.exclude:
            if f.degrades and h not in hosts:
                hosts.append(h)
    return f"--exclude {','.join(hosts)}" if hosts else ""


def prediction_nic(r: PerfResult) -> str:
    """The NIC the collective is compared with: the one its launch names first in NCCL_SOCKET_IFNAME and its
    kin (--network-interface's first, else the first routable NIC); "" when none was measured."""
    return r.collective_nic or (r.nics[0] if r.nics else "")


def collective_prediction(r: PerfResult) -> float | None:
    """The bus bandwidth a ring allreduce could reach: the slowest measured link (Mb/s) on prediction_nic."""
    nic = prediction_nic(r)
    return min((s.mbps for s in r.links if s.mbps and nic and s.nic == nic), default=None)
