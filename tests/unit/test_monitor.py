"""supervisor/monitor.py and supervisor/straggler_plot.py on window summaries (pure parts and rendering;
the real launches, under tmux and off a terminal, are in tests/process/test_monitor_launch.py)."""
import io
import json
import re

from rich.console import Console

from trainrun.supervisor import monitor as mon
from trainrun.supervisor import straggler as st
from trainrun.supervisor import straggler_plot as plot

HOSTS64 = {r: f"node{r // 8 + 1:02d}" for r in range(64)}  # 8 hosts x 8 ranks


def win(rank, wall=4000, wait=1000, coll=100, last=10, steps=40, bytes_=8_000_000, rss=300, gpu=0, at=0.0):
    return st.Window(rank, at, wall, wait, coll, last, steps, 0, bytes_, rss, gpu)


def test_one_row_per_host_with_its_ranks_folded_and_the_figures_of_their_windows():
    latest = {r: win(r, wait=3000 if r < 8 else 1000, last=2 if r < 56 else 12) for r in range(64)}
    rows = mon.rows(latest, HOSTS64, named=tuple(range(56, 64)))
    assert [r.label for r in rows] == [f"node{i:02d}" for i in range(1, 9)]
    first, last = rows[0], rows[-1]
    assert first.ranks == tuple(range(8)) and abs(first.wait - 0.75) < 1e-9 and abs(first.compute - 0.25) < 1e-9
    assert abs(first.rate - 10.0) < 1e-9 and not first.per_collective       # 40 steps in 4 s
    assert abs(last.last - 0.96) < 1e-9 and last.straggler and not first.straggler  # 8 x 12% summed
    assert abs(first.bytes_per_s - 2e6) < 1e-6 and first.rss_mb == 8 * 300
    assert mon.cells(last)[:2] == ["> node08", "56-63"]


def test_a_one_host_job_gets_a_row_per_rank_and_blocking_collectives_without_an_optimizer():
    rows = mon.rows({r: win(r, steps=-56) for r in range(4)}, {r: "localhost" for r in range(4)})
    assert [r.label for r in rows] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert rows[0].per_collective and mon.cells(rows[0])[2] == "14.0c"
    assert "14.0 collectives/s" in mon.plain_lines(rows)[0]


def test_more_rows_than_the_screen_keeps_the_straggler_and_says_how_many_are_left_out():
    hosts = {r: f"h{r:03d}" for r in range(100)}
    rows = mon.rows({r: win(r) for r in range(100)}, hosts, named=(77,))
    shown, left = mon.fit(rows, 17)
    assert len(shown) == 16 and left == 84 and shown[0].label == "h077"


def render(monitor, width=80, height=24) -> str:
    console = Console(file=io.StringIO(), width=width, height=height, color_system=None)
    monitor._console = console
    console.print(monitor.table())
    return console.file.getvalue()


def test_64_ranks_on_8_hosts_fit_80x24_with_the_straggler_marked_and_its_line():
    m = mon.Monitor(dict(HOSTS64))
    for r in range(64):
        m.on_window(win(r, wait=200 if r >= 56 else 2500, last=12 if r >= 56 else 1))
    v = st.StragglerVerdict(tuple(range(56, 64)), "node08", 0.96, 0.62, 1.9, 30.0, "inside")
    m.on_verdict(v, st.describe(v, HOSTS64), recovered=False)
    text = render(m)
    lines = text.splitlines()
    assert len(lines) <= 24 and max(map(len, lines)) <= 80, text
    assert "64 ranks on 8 host(s)" in lines[0]
    assert sum(1 for x in lines if re.match(r"\s*>? ?node\d\d\s", x)) == 8, text
    assert re.search(r"> node08\s+56-63\s+10\.0\s+95%\s+5%\s+96%\s+2\.0 MB/s\s+2400 MiB", text), text
    assert "straggler: host node08 (ranks 56, 57, 58, 59, 60, 61, 62, 63)" in text
    m.on_verdict(v, st.recovered(v, HOSTS64), recovered=True)
    assert "> node08" not in render(m) and "straggler:" not in render(m)


def test_json_events_for_a_straggler_its_recovery_and_the_summary():
    err = io.StringIO()
    hosts = {0: "h1", 1: "h1", 2: "h2", 3: "h2"}
    w = st.Watch(dict(hosts))
    w.listener = mon.Monitor(dict(hosts), json_events=True, err=err)
    w.text_lines = False
    lines = []
    for i in range(4):  # rank 3 slow (tests/unit/test_straggler_verdict.py's shape)
        for r in range(4):
            lines += w.on_window(r, f"4000 {40 if r == 3 else 1600} 100 {95 if r == 3 else 2} 20 0", 4.0 * (i + 1))
    for i in range(4, 14):
        for r in range(4):
            lines += w.on_window(r, "4000 300 100 10 20 0", 4.0 * (i + 1))
    assert lines == [] and w.summary() == []  # --json: nothing printed as text
    events = [json.loads(x) for x in err.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["straggler", "straggler_recovered", "straggler_summary"]
    assert events[0]["ranks"] == [3] and events[0]["host"] is None and events[0]["last_share"] == 0.95
    assert events[0]["message"].startswith("straggler: rank 3 on h2: it was last to 95%")
    assert events[1]["message"] == "straggler: rank 3 on h2 keeps up again"
    assert events[2]["slowest"][0]["rank"] == 3 and "--exclude h2" in events[2]["message"]


def test_a_listener_that_fails_is_dropped_and_the_detection_goes_on():
    class Broken:
        closed = False

        def on_window(self, w):
            raise RuntimeError("terminal gone")

        def close(self):
            Broken.closed = True
    hosts = {0: "h1", 1: "h1", 2: "h2", 3: "h2"}
    w = st.Watch(dict(hosts))
    w.listener = Broken()
    lines = []
    for i in range(4):
        for r in range(4):
            lines += w.on_window(r, f"4000 {40 if r == 3 else 1600} 100 {95 if r == 3 else 2} 20 0", 4.0 * (i + 1))
    assert w.listener is None and Broken.closed
    assert len(lines) == 1 and lines[0].startswith("straggler: rank 3")


def records(n_ranks=6, windows=8, slow=4):
    out = []
    for i in range(windows):
        for r in range(n_ranks):
            out.append({"time": 1000.0 + 4 * (i + 1), "rank": r, "host": f"h{r // 2 + 1}", "wall_ms": 4000,
                        "wait_ms": 100 if r == slow else 2000, "collectives": 100, "last": 90 if r == slow else 3,
                        "steps": 20, "before_ms": 0, "straggler": [slow] if i >= 3 else None})
    return out


def test_the_plot_is_one_self_contained_page_with_every_rank(tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    with open(d / "straggler.jsonl", "w") as f:
        for r in records():
            f.write(json.dumps(r) + "\n")
        f.write('{"time": 1, "rank"')  # a record cut off by a kill: skipped
    path = plot.write_plot(str(d))
    page = open(path).read()
    assert path.endswith("straggler.html") and page.startswith("<!DOCTYPE html>")
    for r in range(6):  # both charts draw every rank, its host in the tooltip
        assert page.count(f'data-rank="{r}"') == 2, r
        assert f"rank {r} on h{r // 2 + 1}" in page
    assert page.count("<svg") == 2 and "time per optimizer step (ms)" in page
    assert "straggler named: rank(s) 4" in page  # the shaded span
    # nothing fetched: no script, no external reference (the SVG namespace is a name, not a fetch)
    for needle in ("<script", "src=", "href=", "url(", "@import", "<link"):
        assert needle not in page, needle
    rows = re.findall(r"<tr><td>(\d+)</td><td>(h\d)</td><td>(\d+)</td><td>([\d.]+)</td><td>(\d+)%</td></tr>", page)
    assert [(int(a), b) for a, b, *_ in rows] == [(r, f"h{r // 2 + 1}") for r in range(6)]
    assert rows[4][4] == "2" and rows[0][4] == "50"  # the straggler waits least


def test_no_records_no_plot_and_an_empty_record_file_says_so(tmp_path):
    assert plot.write_plot(str(tmp_path)) is None
    (tmp_path / "straggler.jsonl").write_text("")
    assert "No window summaries" in open(plot.write_plot(str(tmp_path))).read()
