"""The live view of a running job (`--monitor`) and the straggler events for tools (`--json`).

Both listen to the straggler Watch (supervisor/straggler.py: `Watch.listener`), which the Job already
feeds every rank's window summary (wire/perf_line.py, every 4 s, over the agents' PROGRESS frames): no new
channel, no hook in the Job's loop, and everything runs in the loop's thread (no locks).

The view: one row per host (its ranks folded into a rank set; a one-host job gets one row per rank), from
each rank's latest window: optimizer steps per second (ranks without an optimizer: blocking collectives
per second, marked `c`), the share of wall time computing vs blocked in collectives, the last-arriver share
(a host: its ranks' summed, at most 100%), the allreduce payload per second (the inputs' bytes over the
window's wall time: what the job pushes through allreduce, not the link's bandwidth), and the memory (the
ranks' resident sets summed; GPU memory torch allocated, where any). The straggler named now is marked `>`
and drawn in bold red, its verdict line below the table. More rows than the screen holds: the straggler's
first, then the rest in order, and a line saying how many are left out.

On a terminal (stdout a tty) the table redraws in place (rich's Live, refreshed as windows arrive, at most
twice a second) and the ranks' output and trainrun's lines scroll above it; it ends, left on screen as it
last was, when the job ends (Watch.summary). Off a terminal the same rows are plain `trainrun: monitor:`
lines on stderr every PLAIN_EVERY_S. rich is imported only here, and this module only with --monitor or
--json (the launch path's import rule, docs/architecture.md).

--json: the straggler lines become JSON objects on stderr, one per line, without the `trainrun: ` prefix
(stdout carries the ranks' output): `{"event": "straggler", ...}` when one is named, `"straggler_recovered"`
when it keeps up again, `"straggler_summary"` at the end if one was seen; each with `message`, the text line.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from trainrun.supervisor.straggler import StragglerVerdict, Window

PLAIN_EVERY_S = 10.0
REFRESH_S = 0.5
FIXED_LINES = 7  # title, header, its rule, the verdict line (2), a left-out line, the prompt below


@dataclass(frozen=True)
class Row:
    label: str                   # host, or "rank N" in a one-host job
    ranks: tuple[int, ...]
    rate: float | None           # steps (or blocking collectives, `per_collective`) per second
    per_collective: bool
    compute: float               # shares of wall time
    wait: float
    last: float
    bytes_per_s: float
    rss_mb: int
    gpu_mb: int
    straggler: bool


def rows(latest: dict[int, Window], hosts: dict[int, str], named: tuple[int, ...] = ()) -> list[Row]:
    """One Row per host (per rank when every rank is on one host) from each rank's latest window."""
    groups: dict[str, list[int]] = {}
    one_host = len(set(hosts.values())) == 1
    for r in sorted(latest):
        groups.setdefault(f"rank {r}" if one_host else hosts.get(r, "?"), []).append(r)
    out = []
    for label, ranks in groups.items():
        ws = [latest[r] for r in ranks]
        optimizer = all(w.steps > 0 for w in ws)
        rate = statistics.mean(abs(w.steps) / (w.wall_ms / 1000) for w in ws) if any(w.steps for w in ws) else None
        wait = statistics.mean(w.wait_ms / w.wall_ms for w in ws)
        last = min(1.0, sum(w.last / w.collectives for w in ws if w.collectives))
        out.append(Row(label, tuple(ranks), rate, not optimizer, 1 - wait, wait, last,
                       statistics.mean(w.reduced_bytes / (w.wall_ms / 1000) for w in ws),
                       sum(w.rss_mb for w in ws), sum(w.gpu_mb for w in ws), bool(set(ranks) & set(named))))
    return out


def fit(rs: list[Row], room: int) -> tuple[list[Row], int]:
    """At most `room` rows, the straggler's first; and how many were left out."""
    if len(rs) <= room:
        return rs, 0
    room = max(room - 1, 1)  # one line says how many are left out
    ordered = [r for r in rs if r.straggler] + [r for r in rs if not r.straggler]
    return ordered[:room], len(rs) - room


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def memory(mb: int, gpu: int) -> str:
    text = f"{mb / 1024:.1f} GiB" if mb >= 10240 else f"{mb} MiB"
    return text + (f" +{gpu} GPU" if gpu else "")


def cells(r: Row) -> list[str]:
    """The row's columns as text (the table's and the plain line's)."""
    from trainrun.rankset import format_ranks

    rate = "-" if r.rate is None else f"{r.rate:.1f}" + ("c" if r.per_collective else "")
    return [("> " if r.straggler else "") + r.label, format_ranks(r.ranks), rate, f"{r.compute:.0%}",
            f"{r.wait:.0%}", f"{r.last:.0%}", human_bytes(r.bytes_per_s) + "/s", memory(r.rss_mb, r.gpu_mb)]


HEADERS = ("host", "ranks", "steps/s", "compute", "wait", "last", "allreduce", "memory")


def plain_lines(rs: list[Row]) -> list[str]:
    """Off a terminal: one line per row."""
    out = []
    for r in rs:
        c = cells(r)
        rate = f"{c[2][:-1]} collectives/s" if r.per_collective and r.rate is not None else f"{c[2]} steps/s"
        out.append(f"monitor: {c[0]} [{c[1]}]: {rate}, compute {c[3]}, wait {c[4]}, last {c[5]}, "
                   f"allreduce {c[6]}, memory {c[7]}" + ("  <- straggler" if r.straggler else ""))
    return out


def event(kind: str, v: StragglerVerdict | None, message: str, **more) -> str:
    """One JSON line for --json."""
    d: dict = {"event": kind, "time": round(time.time(), 3)}
    if v is not None:
        d.update(ranks=list(v.ranks), host=v.host, last_share=round(v.last_share, 4),
                 others_wait=round(v.others_wait, 4),
                 compute_ratio=None if v.compute_ratio == float("inf") else round(v.compute_ratio, 3),
                 span_s=round(v.span_s, 1), where=v.where or None)
    d.update(more)
    d["message"] = message
    return json.dumps(d)


class Monitor:
    """The Watch's listener: `on_window` for every window, `on_verdict` for a straggler named or recovered,
    `on_summary` at the end, `close` when the job ends. `live`: draw the table in place (stdout a tty);
    `plain`: plain lines every PLAIN_EVERY_S; `json_events`: --json lines on stderr."""

    def __init__(self, hosts: dict[int, str], *, live: bool = False, plain: bool = False,
                 json_events: bool = False, err=None, clock=time.monotonic):
        self.hosts = hosts
        self.live, self.plain, self.json_events = live, plain, json_events
        self.err = err if err is not None else sys.stderr
        self.clock = clock
        self.latest: dict[int, Window] = {}
        self.named: StragglerVerdict | None = None
        self.named_line = ""
        self._live: Any = None      # rich.live.Live, while drawing (rich is imported only then)
        self._console: Any = None
        self._drawn = 0.0
        self._printed = clock()

    # ---- the Watch's calls
    def on_window(self, w: Window) -> None:
        self.latest[w.rank] = w
        now = self.clock()
        if self._live is not None and now - self._drawn >= REFRESH_S:
            self._drawn = now
            self._live.update(self.table(), refresh=True)
        elif self.plain and len(self.latest) == len(self.hosts) and now - self._printed >= PLAIN_EVERY_S:
            self._printed = now
            for line in plain_lines(rows(self.latest, self.hosts, self.named.ranks if self.named else ())):
                self._say(f"trainrun: {line}")

    def on_verdict(self, v: StragglerVerdict, line: str, recovered: bool) -> None:
        self.named, self.named_line = (None, "") if recovered else (v, line)
        if self.json_events:
            self._say(event("straggler_recovered" if recovered else "straggler", v, line))
        if self._live is not None:
            self._live.update(self.table(), refresh=True)

    def on_summary(self, lines: list[str], ranking: list[dict]) -> None:
        if self.json_events and lines:
            self._say(event("straggler_summary", None, "\n".join(lines), slowest=ranking))

    def close(self) -> None:
        """The last table stays on screen; the cursor and sys.stdout/stderr are given back."""
        live, self._live = self._live, None
        if live is not None:
            live.update(self.table(), refresh=True)
            live.stop()

    # ---- drawing
    def start(self, sink) -> None:
        """Begin the live table on stdout; `sink` (supervisor/output.OutputSink): its writes go through
        the live console, above the table (a write past it would break the redraw)."""
        from rich.console import Console
        from rich.live import Live

        self._console = Console(file=sys.stdout, highlight=False, emoji=False, markup=False)
        self._live = Live(self.table(), console=self._console, auto_refresh=False, transient=False,
                          redirect_stdout=True, redirect_stderr=True)
        self._live.start(refresh=True)
        # the sink's own streams (OutputSink._out: fd 1 and 2 as it found them at start) are swapped for the
        # console's; it has no other caller, and this is the one place that needs it
        sink._out[1] = _ConsoleStream(self._console)
        if sys.stderr.isatty():  # (a redirected stderr keeps its file)
            sink._out[2] = _ConsoleStream(self._console)

    def table(self):
        from rich import box
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        rs = rows(self.latest, self.hosts, self.named.ranks if self.named else ())
        height = self._console.size.height if self._console is not None else 24
        shown, left = fit(rs, max(height - FIXED_LINES, 1))
        n_hosts = len(set(self.hosts.values()))
        t = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, expand=False,
                  title=f"trainrun --monitor: {len(self.hosts)} ranks on {n_hosts} host(s), {time.strftime('%H:%M:%S')}",
                  title_justify="left")
        for i, h in enumerate(HEADERS):
            t.add_column("rank" if h == "host" and n_hosts == 1 else h, justify="left" if i < 2 else "right",
                         no_wrap=True)
        for r in shown:
            t.add_row(*cells(r), style="bold red" if r.straggler else None)
        parts = [t]
        if not rs:
            parts.append(Text("waiting for the ranks' first window summaries (every 4 s)"))
        if left:
            parts.append(Text(f"... {left} more"))
        if self.named_line:
            parts.append(Text(self.named_line, style="bold red"))
        return Group(*parts)

    def _say(self, text: str) -> None:
        try:
            self.err.write(text + "\n")
            self.err.flush()
        except (OSError, ValueError):
            pass


class _ConsoleStream:
    """A binary stream (what OutputSink writes) that prints through a rich Console: above a Live table."""

    def __init__(self, console):
        self.console = console

    def write(self, data: bytes) -> int:
        from rich.text import Text

        text = data.decode(errors="replace")
        self.console.print(Text(text[:-1] if text.endswith("\n") else text), soft_wrap=True)
        return len(data)

    def flush(self) -> None:
        pass


def attach(job, monitor: bool, json_events: bool) -> Monitor | None:
    """Listen to `job`'s straggler Watch: the live view (`monitor`) and/or --json events. None for a job
    without one (a single rank: no collectives between ranks to show)."""
    from trainrun import log

    watch = job.stragglers
    if watch is None:
        if monitor:
            log.warning("--monitor: a job of one rank has no collectives to show; running without the view")
        return None
    tty = monitor and sys.stdout.isatty()
    mon = Monitor(dict(watch.hosts), live=tty, plain=monitor and not tty, json_events=json_events)
    watch.listener = mon
    watch.text_lines = not json_events
    if tty:
        mon.start(job.sink)
    return mon


def attach_to_job(job, monitor: bool, json_events: bool) -> Monitor | None:
    """What the command line asked for (--monitor, --json), attached to a Job as assemble_job builds it
    (every elastic attempt's too); a live view is also closed at exit."""
    mon = attach(job, monitor, json_events)
    if mon is not None and mon.live:
        import atexit

        atexit.register(mon.close)  # if the Job's straggler Watch is dropped before the summary closes it
    return mon
