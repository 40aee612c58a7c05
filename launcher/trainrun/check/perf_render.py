"""`--check --perf` for people (tables, and the link matrix as a heat map) and for scripts (JSON). Pure.

The heat map colours each cell by its share of the NIC's reference bandwidth (perf_verdict.link_reference):
green at 75% and above, yellow from LINK_FRACTION, red below it. Colour only when asked (a terminal);
without colour a slow cell carries a `!` so the slow row reads the same in a log file.
"""
from __future__ import annotations

from dataclasses import asdict

from trainrun.check.perf_verdict import (
    LINK_FRACTION,
    Finding,
    PerfResult,
    collective_prediction,
    degraded,
    exclude_advice,
    link_matrix,
    link_reference,
    prediction_nic,
)
from trainrun.table import render_table

GREEN, YELLOW, RED, RESET = "\033[32m", "\033[33m", "\033[31m", "\033[0m"


def _mbps(v: float | None) -> str:
    return "fail" if v is None else f"{v:.0f}"


def heat_map(r: PerfResult, nic: str, color: bool) -> list[str]:
    """Bandwidth (Mb/s) matrix of one NIC: row = sender, column = receiver."""
    m = link_matrix(r.links, nic)
    ref, _ = link_reference(r.links, nic, r.hosts)
    header = ("FROM \\ TO", *r.hosts)
    rows, grades = [], []
    for a in r.hosts:
        row = [a]
        grade: list[str | None] = [None]
        for b in r.hosts:
            s = m.get((a, b))
            if a == b or s is None:
                row.append("-" if a == b else "?")
                grade.append(None)
                continue
            bad = s.mbps is None or (ref is not None and s.mbps < LINK_FRACTION * ref)
            row.append(_mbps(s.mbps) + ("!" if bad and not color else ""))
            grade.append(RED if bad or s.mbps is None else GREEN if ref is None or s.mbps >= 0.75 * ref else YELLOW)
        rows.append(row)
        grades.append(grade)
    lines = render_table(header, rows, "  ")
    if not color:
        return lines
    # colour after the layout: escape codes must not count towards the column widths
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    out = [lines[0]]
    for row, grade in zip(rows, grades):
        cells = [(g + str(c).ljust(w) + RESET) if g else str(c).ljust(w) for c, w, g in zip(row, widths, grade)]
        out.append(("  " + "  ".join(cells)).rstrip())
    return out


def latency_table(r: PerfResult, nic: str) -> list[str]:
    m = link_matrix(r.links, nic)
    rows = []
    for a in r.hosts:
        rows.append([a] + ["-" if a == b else (f"{m[(a, b)].rtt_us:.0f}" if (a, b) in m and m[(a, b)].rtt_us else "?")
                           for b in r.hosts])
    return render_table(("RTT us", *r.hosts), rows, "  ")


def render_perf(r: PerfResult, found: list[Finding], color: bool = False) -> list[str]:
    out = ["", f"Performance ({len(r.hosts)} host(s), {r.rounds} link round(s) of disjoint pairs, "
               f"{r.seconds_per_direction:.2f} s per direction, {r.wall_s:.1f} s)"]
    for nic in r.nics:
        out += ["", f"Link bandwidth on {nic}, Mb/s (row sends, column receives)"]
        out += heat_map(r, nic, color)
        out += ["", f"Round-trip time on {nic}"]
        out += latency_table(r, nic)
    if r.host_samples:
        out += ["", "Hosts"]
        rows = []
        for s in r.host_samples:
            gpus = ", ".join(f"{g['index']}: {g['mem_free_mib']} MiB free" + (f", {g['procs']} proc(s)" if g["procs"] else "")
                             for g in s.gpus) or "-"
            clock = "?" if s.clock_offset_ms is None else f"{s.clock_offset_ms:+.1f} ms (+-{s.clock_error_ms:.1f})"
            rows.append((s.host, "fail" if s.gflops is None else f"{s.gflops:.1f}", f"{s.load1:.1f}", s.cpus,
                         f"{s.mem_avail_mib} MiB", gpus, clock))
        out += render_table(("HOST", "GFLOP/S (1 core)", "LOAD", "CPUS", "MEM FREE", "GPUS", "CLOCK OFFSET"), rows, "  ")
    if r.versions:
        out += ["", "Sameness (* differs from the majority)"]
        rows = []
        for label, by_host in r.versions.items():
            values = list(by_host.values())
            common = max(set(values), key=values.count)
            cells = [(" ".join(str(v).split()) if v is not None else "-") + ("" if v == common else " *") for v in values]
            rows.append((label, *cells))
        out += render_table(("", *r.versions[next(iter(r.versions))]), rows, "  ")
    if r.collective or r.collective_error:
        out += ["", "Allreduce over the job's plan"]
        pred = collective_prediction(r)
        if r.collective:
            nic = prediction_nic(r)
            out += render_table(("SIZE", "TIME", "BUS BW", f"OF SLOWEST LINK ON {nic}" if nic else "OF SLOWEST LINK"), [
                (f"{c.size_bytes >> 10} KiB", f"{c.seconds * 1e3:.2f} ms", f"{c.busbw_mbps:.0f} Mb/s",
                 f"{c.busbw_mbps / pred:.0%}" if pred else "?") for c in r.collective], "  ")
            if pred:
                out.append(f"  the slowest link on {nic} predicts at most {pred:.0f} Mb/s of bus bandwidth (ring allreduce)")
        else:
            out.append(f"  {r.collective_error}")
    out.append("")
    out += [f"perf skipped: {s}" for s in r.skipped]
    for f in found:
        out.append(f"{'degraded' if f.degrades else 'note'}: {f.message}" + (f"; {f.advice}" if f.advice else ""))
    if degraded(found):
        advice = exclude_advice(found)
        out.append(f"perf verdict: DEGRADED, {sum(f.degrades for f in found)} finding(s)"
                   + (f"; to run without them: {advice}" if advice else ""))
    else:
        out.append("perf verdict: OK, no host or link below the thresholds")
    return out


def perf_json(r: PerfResult, found: list[Finding]) -> dict:
    return {
        "degraded": degraded(found),
        "exclude": exclude_advice(found),
        "findings": [asdict(f) for f in found],
        "hosts": r.hosts,
        "nics": r.nics,
        "rounds": r.rounds,
        "seconds_per_direction": r.seconds_per_direction,
        "wall_s": r.wall_s,
        "phases": r.phases,
        "links": {nic: {"reference_mbps": link_reference(r.links, nic, r.hosts)[0],
                        "matrix": [[None if a == b or (a, b) not in link_matrix(r.links, nic)
                                    else link_matrix(r.links, nic)[(a, b)].mbps for b in r.hosts] for a in r.hosts],
                        "samples": [asdict(s) for s in r.links if s.nic == nic]} for nic in r.nics},
        "compute": [asdict(s) for s in r.host_samples],
        "versions": r.versions,
        "collective": {"samples": [asdict(c) for c in r.collective], "error": r.collective_error,
                       "predicted_mbps": collective_prediction(r), "predicted_nic": prediction_nic(r)},
        "skipped": r.skipped,
    }
