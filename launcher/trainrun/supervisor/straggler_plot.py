"""A picture of a job after the fact: `--output-dir`'s straggler.jsonl (one record per rank and window,
supervisor/straggler.py) drawn as DIR/straggler.html, so that the slow rank is visible at a glance.

One self-contained file (inline SVG and CSS, no script, nothing fetched: it opens offline and from a mail):
two charts over the job's time, one line per rank (its colour by rank, its host in the legend and in the
line's tooltip): the time per step (a window's wall time over its optimizer steps; ranks without an
optimizer: per blocking collective, said in the chart's title) and the share of the window spent waiting
in collectives. The straggler stands out in both: it waits least, and every rank's step time rises with
it. Windows in which a straggler was named are shaded, with the ranks named in the shading's tooltip.
Each rank's line carries `data-rank="N"` (tests and tools find every rank). Pure: records in, text out;
`write_plot` is the one effect.
"""
from __future__ import annotations

import html
import json
import os

W, H = 760, 240              # one chart's drawing area, in SVG units
LEFT, RIGHT, TOP, BOTTOM = 60, 150, 28, 32
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")


def load(path: str) -> list[dict]:
    """The records of a straggler.jsonl (lines that do not parse are skipped: a job killed mid-write)."""
    out = []
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict) and {"time", "rank", "wall_ms", "wait_ms", "steps"} <= r.keys() and r["wall_ms"] > 0:
                out.append(r)
    return out


def _series(records: list[dict]) -> tuple[dict[int, list[tuple[float, float, float]]], bool]:
    """rank -> [(seconds since the first window, ms per step, wait share)]; and whether steps are optimizer steps."""
    t0 = min(r["time"] - r["wall_ms"] / 1000 for r in records)
    optimizer = all(r["steps"] > 0 for r in records)
    by_rank: dict[int, list] = {}
    for r in records:
        n = abs(r["steps"])
        per = r["wall_ms"] / n if n else None
        by_rank.setdefault(r["rank"], []).append((r["time"] - t0, per, min(1.0, r["wait_ms"] / r["wall_ms"])))
    return by_rank, optimizer


def _chart(title: str, by_rank: dict, index: int, y_max: float, y_label, hosts: dict[int, str],
           shaded: list[tuple[float, float, str]], t_max: float) -> str:
    def x(t: float) -> float:
        return LEFT + W * t / t_max if t_max else LEFT

    def y(v: float) -> float:
        return TOP + H - H * v / y_max if y_max else TOP + H

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + W + RIGHT}" height="{TOP + H + BOTTOM}" '
             f'role="img"><title>{html.escape(title)}</title>',
             f'<text x="{LEFT}" y="18" class="title">{html.escape(title)}</text>']
    for a, b, who in shaded:
        parts.append(f'<rect x="{x(a):.1f}" y="{TOP}" width="{max(x(b) - x(a), 1):.1f}" height="{H}" class="named">'
                     f'<title>straggler named: {html.escape(who)}</title></rect>')
    for i in range(5):  # axes and grid
        v = y_max * i / 4
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + W}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>'
                     f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" class="ytick">{html.escape(y_label(v))}</text>')
    for i in range(6):
        t = t_max * i / 5
        parts.append(f'<text x="{x(t):.1f}" y="{TOP + H + 16}" class="xtick">{t:.0f} s</text>')
    for n, rank in enumerate(sorted(by_rank)):
        colour = PALETTE[rank % len(PALETTE)]
        dash = "" if rank < len(PALETTE) else ' stroke-dasharray="5 3"'
        pts = " ".join(f"{x(p[0]):.1f},{y(min(p[index], y_max)):.1f}" for p in by_rank[rank] if p[index] is not None)
        who = f"rank {rank} on {hosts.get(rank, '?')}"
        parts.append(f'<polyline data-rank="{rank}" points="{pts}" stroke="{colour}"{dash} class="rank">'
                     f'<title>{html.escape(who)}</title></polyline>')
        if n < (H + BOTTOM) // 13:  # the legend, as far as it fits beside the chart
            ly = TOP + 10 + 13 * n
            parts.append(f'<line x1="{LEFT + W + 10}" x2="{LEFT + W + 28}" y1="{ly - 4}" y2="{ly - 4}" stroke="{colour}"'
                         f'{dash} class="rank"/><text x="{LEFT + W + 32}" y="{ly}" class="legend">{html.escape(who)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def render(records: list[dict]) -> str:
    """The HTML page for `records` (straggler.jsonl's, in any order)."""
    if not records:
        return _page("<p>No window summaries were recorded (a job of one rank, or shorter than one window).</p>")
    records = sorted(records, key=lambda r: r["time"])
    hosts = {r["rank"]: r.get("host") or "?" for r in records}
    by_rank, optimizer = _series(records)
    t_max = max(p[0] for s in by_rank.values() for p in s) or 1.0
    pers = sorted(p[1] for s in by_rank.values() for p in s if p[1] is not None)
    # the scale: a window of start-up (one slow first step) must not flatten the rest
    y_step = (pers[min(len(pers) - 1, int(len(pers) * 0.98))] * 1.15) if pers else 1.0
    shaded, start, who = [], None, ""
    for r in records:  # spans in which a straggler was named (any rank's record says so)
        named = r.get("straggler")
        if named and start is None:
            start, who = r["time"], ", ".join(map(str, named))
        elif not named and start is not None:
            shaded.append((start, r["time"], who))
            start = None
    if start is not None:
        shaded.append((start, records[-1]["time"], who))
    t0 = min(r["time"] - r["wall_ms"] / 1000 for r in records)
    shaded = [(a - t0, b - t0, f"rank(s) {w}") for a, b, w in shaded]
    unit = "optimizer step" if optimizer else "blocking collective"
    body = [
        f"<h1>trainrun: {len(by_rank)} ranks on {len(set(hosts.values()))} host(s), {t_max:.0f} s</h1>",
        "<p>Each line is one rank, one point per window summary. The straggler waits least while every rank's "
        "step time rises with it; shaded: a straggler was named then.</p>",
        _chart(f"time per {unit} (ms)", by_rank, 1, y_step, lambda v: f"{v:.0f}", hosts, shaded, t_max),
        _chart("share of time waiting in collectives", by_rank, 2, 1.0, lambda v: f"{v:.0%}", hosts, shaded, t_max),
        "<table><tr><th>rank</th><th>host</th><th>windows</th><th>median ms per step</th><th>mean wait</th></tr>",
    ]
    for rank in sorted(by_rank):
        s = by_rank[rank]
        per = sorted(p[1] for p in s if p[1] is not None)
        med = f"{per[len(per) // 2]:.1f}" if per else "-"
        body.append(f"<tr><td>{rank}</td><td>{html.escape(hosts[rank])}</td><td>{len(s)}</td><td>{med}</td>"
                    f"<td>{sum(p[2] for p in s) / len(s):.0%}</td></tr>")
    body.append("</table>")
    return _page("\n".join(body))


def _page(body: str) -> str:
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>trainrun: step time and wait per rank</title>"
            "<style>body{font:13px sans-serif;margin:16px} svg{display:block;margin:8px 0}"
            ".rank{fill:none;stroke-width:1.6} .grid{stroke:#ddd} .named{fill:#fdd}"
            ".title{font-weight:bold} .ytick{text-anchor:end;font-size:11px} .xtick{text-anchor:middle;font-size:11px}"
            ".legend{font-size:11px} table{border-collapse:collapse} td,th{padding:2px 8px;text-align:right}"
            "</style></head><body>\n" + body + "\n</body></html>\n")


def write_plot(output_dir: str) -> str | None:
    """DIR/straggler.html from DIR/straggler.jsonl; its path, or None without records."""
    src = os.path.join(output_dir, "straggler.jsonl")
    if not os.path.exists(src):
        return None
    dst = os.path.join(output_dir, "straggler.html")
    with open(dst, "w") as f:
        f.write(render(load(src)))
    return dst
