"""Folding the output of many ranks into what a person can read (`--fold`). Pure: time is passed in.

Identical lines from several ranks within `window` seconds become one `Folded` line with the rank set
(printed as `[0-7,9]<stdout>:text` by the sink); lines that differ stay one per rank. Each rank's own
lines keep their order: a line joins a pending group only if that group is newer than the group of the
rank's previous line on that stream, and groups are released in the order they were made. A group is
released when it holds every rank whose stream is still open, or when its window has passed.

Progress bars: `\\r` rewrites the current line (tqdm). Only the latest state of a rank's open bar is
kept; every `progress_every` seconds the bars that changed are shown once (folded like lines, so
identical states of many ranks are one line), and the state on the line when its `\\n` comes is shown
as a normal line. A flood of `\\r` updates therefore becomes at most one line per rank set per period.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

MAX_LINE = 1 << 16
WINDOW_S = 0.5
PROGRESS_EVERY_S = 5.0


@dataclass(frozen=True)
class Folded:
    """One line to show: `text` (no newline) written by every rank in `ranks` on `stream` (1 or 2)."""

    stream: int
    ranks: tuple[int, ...]
    text: bytes


class _Group:
    __slots__ = ("seq", "stream", "text", "ranks", "start")

    def __init__(self, seq: int, stream: int, text: bytes, start: float):
        self.seq, self.stream, self.text, self.start = seq, stream, text, start
        self.ranks: set[int] = set()


def visible(line: bytes) -> bytes:
    """What a terminal would show of a line rewritten with `\\r`: its last non-empty piece."""
    if b"\r" not in line:
        return line
    pieces = [p for p in line.split(b"\r") if p]
    return pieces[-1] if pieces else b""


class Folder:
    """Folds the streams of `ranks` (the ranks shown). Every method returns the lines now due, in order."""

    def __init__(self, ranks: Iterable[int], window: float = WINDOW_S, progress_every: float = PROGRESS_EVERY_S):
        self.window, self.progress_every = window, progress_every
        self._open = {(r, s) for r in ranks for s in (1, 2)}
        self._partial: dict[tuple[int, int], bytes] = {}
        self._bar: dict[tuple[int, int], bytes] = {}      # latest state of an open progress bar
        self._shown_bar: dict[tuple[int, int], bytes] = {}
        self._next_snapshot: float | None = None
        self._groups: deque[_Group] = deque()
        self._by_key: dict[tuple[int, bytes], list[_Group]] = {}
        self._last_seq: dict[tuple[int, int], int] = {}
        self._seq = 0

    def feed(self, now: float, rank: int, stream: int, data: bytes) -> list[Folded]:
        """A chunk of a rank's stream; b"" ends the stream (its last partial line is a line)."""
        key = (rank, stream)
        buf = self._partial.pop(key, b"") + data
        if not data:
            self._open.discard(key)
            self._bar.pop(key, None)
            if visible(buf):
                self._line(now, rank, stream, buf)
            return self._release(now)
        *whole, rest = buf.split(b"\n")
        for line in whole:
            self._bar.pop(key, None)
            self._line(now, rank, stream, line)
        if b"\r" in rest:
            state = visible(rest)
            if state:
                self._bar[key] = state
                if self._next_snapshot is None:
                    self._next_snapshot = now + self.progress_every
            rest = rest[rest.rindex(b"\r"):]  # earlier states are overwritten: keep the current one only
        while len(rest) > MAX_LINE:
            self._add(now, rank, stream, rest[:MAX_LINE])
            rest = rest[MAX_LINE:]
        if rest:
            self._partial[key] = rest
        return self._release(now)

    def tick(self, now: float) -> list[Folded]:
        """Lines whose window has passed, and progress bar snapshots when due."""
        if self._next_snapshot is not None and now >= self._next_snapshot:
            for key, state in sorted(self._bar.items()):
                if self._shown_bar.get(key) != state:
                    self._shown_bar[key] = state
                    self._add(now, key[0], key[1], state)
            self._next_snapshot = now + self.progress_every if self._bar else None
        return self._release(now)

    def close(self) -> list[Folded]:
        """Everything still held, in order (partial lines included)."""
        out = []
        for (rank, stream) in sorted(self._partial):
            out += self.feed(float("inf"), rank, stream, b"")
        return out + self._release(float("inf"))

    def _line(self, now: float, rank: int, stream: int, line: bytes) -> None:
        text = visible(line)
        for i in range(0, max(len(text), 1), MAX_LINE):
            self._add(now, rank, stream, text[i:i + MAX_LINE])

    def _add(self, now: float, rank: int, stream: int, text: bytes) -> None:
        after = self._last_seq.get((rank, stream), -1)
        group = None
        for g in self._by_key.get((stream, text), ()):
            if g.seq > after and rank not in g.ranks and now - g.start < self.window:
                group = g
                break
        if group is None:
            self._seq += 1
            group = _Group(self._seq, stream, text, now)
            self._groups.append(group)
            self._by_key.setdefault((stream, text), []).append(group)
        group.ranks.add(rank)
        self._last_seq[(rank, stream)] = group.seq

    def _complete(self, g: _Group) -> bool:
        return all(r in g.ranks for r, s in self._open if s == g.stream)

    def _release(self, now: float) -> list[Folded]:
        out = []
        while self._groups and (now - self._groups[0].start >= self.window or self._complete(self._groups[0])):
            g = self._groups.popleft()
            same = self._by_key[(g.stream, g.text)]
            same.remove(g)
            if not same:
                del self._by_key[(g.stream, g.text)]
            out.append(Folded(g.stream, tuple(sorted(g.ranks)), g.text))
        return out
