"""--fold's pure parts: rank sets, the folding window, per-rank order, \\r progress bars; and --ranks in the sink."""
import io

import pytest

from trainrun.rankset import describe_ranks, format_ranks, parse_ranks
from trainrun.supervisor.fold import Folded, Folder, visible
from trainrun.supervisor.output import OutputSink


@pytest.mark.parametrize("ranks, text", [
    ([0], "0"),
    ([0, 1], "0,1"),
    ([0, 1, 2], "0-2"),
    (range(8), "0-7"),
    ([*range(8), 9], "0-7,9"),
    ([9, 3, 3, 0, 1, 2], "0-3,9"),
    ([0, 2, 4, 5, 6, 10, 11], "0,2,4-6,10,11"),
    ([], ""),
])
def test_format_ranks(ranks, text):
    assert format_ranks(ranks) == text


@pytest.mark.parametrize("text, ranks", [("0,3", {0, 3}), ("0-7,9", {*range(8), 9}), (" 2 , 4-5", {2, 4, 5}), ("7", {7})])
def test_parse_ranks(text, ranks):
    assert parse_ranks(text) == ranks
    assert parse_ranks(format_ranks(ranks)) == ranks


@pytest.mark.parametrize("text", ["", "a", "1-", "-3", "3-1", "1,,2", "0.5"])
def test_parse_ranks_rejects(text):
    with pytest.raises(ValueError):
        parse_ranks(text)


def test_describe_ranks():
    assert describe_ranks([1]) == "rank 1"
    assert describe_ranks([0, *range(2, 16)]) == "ranks 0,2-15"


@pytest.mark.parametrize("line, shown", [
    (b"plain", b"plain"),
    (b"\r 10%\r 20%\r100%", b"100%"),
    (b"\r 10%\r", b" 10%"),
    (b"\r\r", b""),
])
def test_visible(line, shown):
    assert visible(line) == shown


def fold(events, ranks=range(4), window=0.5, progress_every=5.0):
    """events: (time, rank, stream, data) or (time, "tick"); returns [(ranks, stream, text)] in order."""
    f = Folder(ranks, window=window, progress_every=progress_every)
    out = []
    for ev in events:
        if ev[1] == "tick":
            out += f.tick(ev[0])
        else:
            out += f.feed(*ev)
    out += f.close()
    return [(x.ranks, x.stream, x.text) for x in out]


S = 1  # stdout
CASES = {
    "identical lines of all ranks fold at once": (
        [(0.0, r, S, b"hello\n") for r in range(4)],
        [((0, 1, 2, 3), S, b"hello")]),
    "a differing line stays per rank": (
        [(0.0, 0, S, b"loss 1\n"), (0.0, 1, S, b"loss 2\n")],
        [((0,), S, b"loss 1"), ((1,), S, b"loss 2")]),
    "after the window a late rank is a new line": (
        [(0.0, 0, S, b"x\n"), (0.1, 1, S, b"x\n"), (0.7, "tick"), (0.8, 2, S, b"x\n")],
        [((0, 1), S, b"x"), ((2,), S, b"x")]),
    "within the window a late rank joins": (
        [(0.0, 0, S, b"x\n"), (0.4, 1, S, b"x\n"), (0.45, "tick")],
        [((0, 1), S, b"x")]),
    "each rank's order is kept": (
        [(0.0, 0, S, b"a\nb\n"), (0.0, 1, S, b"b\na\n")],
        [((0,), S, b"a"), ((0, 1), S, b"b"), ((1,), S, b"a")]),
    "the same line twice from one rank is two lines": (
        [(0.0, 0, S, b"x\nx\n"), (0.0, 1, S, b"x\nx\n")],
        [((0, 1), S, b"x"), ((0, 1), S, b"x")]),
    "stdout and stderr fold apart": (
        [(0.0, 0, S, b"x\n"), (0.0, 1, 2, b"x\n")],
        [((0,), S, b"x"), ((1,), 2, b"x")]),
    "lines split across chunks": (
        [(0.0, 0, S, b"hel"), (0.0, 1, S, b"hello\n"), (0.1, 0, S, b"lo\n")],
        [((0, 1), S, b"hello")]),
    "a partial last line is a line at the end": (
        [(0.0, 0, S, b"tail"), (0.0, 0, S, b"")],
        [((0,), S, b"tail")]),
    "a closed stream is not waited for": (
        [(0.0, 2, S, b""), (0.0, 3, S, b""), (0.0, 0, S, b"x\n"), (0.0, 1, S, b"x\n")],
        [((0, 1), S, b"x")]),
    "\\r updates: only the final state, folded": (
        [(0.0, r, 2, b"".join(b"\r%3d%%" % p for p in range(0, 101, 10)) + b"\n") for r in range(4)],
        [((0, 1, 2, 3), 2, b"100%")]),
    "\\r updates before the period are not shown": (
        [(0.0, 0, 2, b"\r 10%"), (1.0, 0, 2, b"\r 20%"), (2.0, "tick"), (3.0, 0, 2, b"\rdone\n")],
        [((0,), 2, b"done")]),
    "a long bar shows one snapshot per rank set per period": (
        [(0.0, r, 2, b"\r 10%") for r in range(4)] + [(1.0, r, 2, b"\r 50%") for r in range(4)]
        + [(5.0, "tick"), (5.1, "tick")] + [(6.0, r, 2, b"\r100%\n") for r in range(4)],
        [((0, 1, 2, 3), 2, b" 50%"), ((0, 1, 2, 3), 2, b"100%")]),
    "an unchanged bar is not shown again": (
        [(0.0, 0, 2, b"\r 10%"), (5.0, "tick"), (10.0, "tick"), (11.0, 0, 2, b"\n")],
        [((0,), 2, b" 10%"), ((0,), 2, b" 10%")]),
}


@pytest.mark.parametrize("events, expected", list(CASES.values()), ids=list(CASES))
def test_fold(events, expected):
    assert fold(events) == expected


def test_fold_100_lines_of_8_ranks_interleaved_in_chunks():
    lines = b"".join(b"step %d\n" % i for i in range(100))
    events = [(0.01 * r, r, S, lines[:333]) for r in range(8)] + [(0.2 + 0.01 * r, r, S, lines[333:]) for r in range(8)]
    assert fold(events, ranks=range(8)) == [(tuple(range(8)), S, b"step %d" % i) for i in range(100)]


def test_fold_memory_of_a_bar_is_its_current_state():
    f = Folder([0])
    for i in range(10000):
        f.feed(0.0, 0, 2, b"\r%5d" % i)
    assert len(f._partial[(0, 2)]) < 10
    assert f.close() == [Folded(2, (0,), b" 9999")]


def sink(**kw):
    out, err = io.BytesIO(), io.BytesIO()
    return OutputSink(out=out, err=err, **kw), out, err


def test_sink_ranks_filter_keeps_files_and_tails(tmp_path):
    s, out, err = sink(show=frozenset({0, 3}), output_dir=str(tmp_path))
    for r in range(4):
        s.feed(r, 1, b"hi %d\n" % r)
        s.feed(r, 2, b"err %d\n" % r)
    s.close()
    assert out.getvalue() == b"[0]<stdout>:hi 0\n[3]<stdout>:hi 3\n"
    assert err.getvalue() == b"[0]<stderr>:err 0\n[3]<stderr>:err 3\n"
    assert (tmp_path / "rank.1" / "stdout").read_bytes() == b"hi 1\n"
    assert s.stderr_tail(2) == ["err 2"]


def test_sink_fold_prefix():
    now = [0.0]
    s, out, _ = sink(folder=Folder(range(3)), clock=lambda: now[0])
    for r in range(3):
        s.feed(r, 1, b"same\n")
    s.feed(1, 1, b"own\n")
    now[0] = 1.0
    s.tick()
    assert out.getvalue() == b"[0-2]<stdout>:same\n[1]<stdout>:own\n"
