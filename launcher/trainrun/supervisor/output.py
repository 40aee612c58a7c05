"""Rank output: whole lines, prefixed, written to the launcher's stdout/stderr and optionally to files.

Bytes in, bytes out: binary-safe. A line is written in one write, so lines of different ranks never
interleave inside a line. A partial last line is kept until more data or EOF, then written with a
newline added. Lines longer than MAX_LINE are cut into pieces so memory stays bounded.

`show` (--ranks) limits what reaches the console; --output-dir and the stderr tails still get every
rank. With a `Folder` (--fold, fold.py) console lines go through it: identical lines of many ranks as
one `[0-7]<stdout>:` line, `\r` progress bars as occasional snapshots. Without either the output is
exactly as before.

Terminal control: where the launcher's stdout or stderr is a terminal (isatty when the sink is made), rank
lines written there show the bytes a terminal would act on as text (`terminal_safe`: a rank's screen clear,
window title or cursor move appears as `\\x1b[2J`, ...), except colour (SGR) and tab/CR. Where it is not a
terminal (a pipe, a file: the user's own redirect), and in --output-dir's files, the bytes are as written.
"""
from __future__ import annotations

from typing import BinaryIO, NamedTuple, TYPE_CHECKING

import os
import re
import sys
import time

from trainrun.errors import UsageError

if TYPE_CHECKING:
    from trainrun.supervisor.fold import Folded, Folder
from collections import deque


STREAMS = {1: "stdout", 2: "stderr"}
# --prefix: `[0]<stdout>:` (rank), the same after a time (timestamp), Open MPI's `--tag-output` form
# `[1,0]<stdout>:` that Horovod users grep for (mpi; 1 is the job's number there), the same after a time
PREFIXES = ("rank", "timestamp", "mpi", "mpi-timestamp", "none")
MAX_LINE = 1 << 16
SIGPIPE_EXIT = 128 + 13  # the reader of our output went away (`trainrun ... | head`): what a shell reports for SIGPIPE
TAIL_LINES = 200  # kept per rank for the failure summary (result.py picks what to show, e.g. a traceback)
TAIL_LINE_CHARS = 2000


# What a terminal acts on instead of showing: C0 controls but tab, LF and CR (a progress bar's \r stays), ESC
# (starting CSI, OSC, DCS, ...), and the C1 controls as UTF-8 encodes them (U+0080-U+009F: \xc2\x80-\xc2\x9f).
# A lone byte 0x80-0x9f is left alone: in UTF-8 text it is the continuation byte of a character (`é`, `€`).
_CONTROL = rb"[\x00-\x08\x0b\x0c\x0e-\x1f]|\xc2[\x80-\x9f]"
# the fast test for "nothing to escape": bytes.translate deleting these runs at ~2 GB/s, 20x the regex's scan
_MAYBE_CONTROL = bytes([*range(0x09), 0x0b, 0x0c, *range(0x0e, 0x20), 0xc2])
# SGR (colour, bold: ESC [ digits ; : m) is let through whole; every other control is shown as \xNN
_TO_ESCAPE = re.compile(rb"(\x1b\[[0-9;:]*m)|" + _CONTROL)


def _escaped(m: re.Match[bytes]) -> bytes:
    return m[1] or b"\\x%02x" % m[0][-1]  # a C1 control's last byte is its code point


def terminal_safe(data: bytes) -> bytes:
    """`data` with every terminal control shown as text (`\\x1b`, `\\x07`, `\\x9b` for the C1 character
    U+009B), SGR colour sequences, tab, LF and CR kept. Meant for whole lines: a sequence cut in two
    is escaped, never let through. Returns `data` itself when it holds no control (the common case,
    one pass over the bytes)."""
    if len(data.translate(None, _MAYBE_CONTROL)) == len(data):
        return data
    return _TO_ESCAPE.sub(_escaped, data)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty (a test's buffer), or closed
        return False


def _cut(line: bytes) -> list[bytes]:
    """A line as pieces of at most MAX_LINE bytes (an empty line stays one empty piece)."""
    return [line[i:i + MAX_LINE] for i in range(0, len(line), MAX_LINE)] or [b""]


def reader_gone(fd: int) -> bool:
    """True if `fd` is a pipe or socket whose reading end is closed, so that writes to it fail with EPIPE
    (poll reports POLLERR for a pipe without readers; a file or an open terminal never reports it)."""
    import select

    poller = select.poll()
    try:
        poller.register(fd, select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError):
        return False


def silence_closed_outputs() -> None:
    """Point fd 1 and 2 at /dev/null where their reader has gone: the interpreter's flush at exit then
    has nowhere to fail ("Exception ignored ... BrokenPipeError")."""
    for fd in (1, 2):
        if reader_gone(fd):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)


def prepare_output_dir(path: str) -> None:
    """Create --output-dir before any rank starts; UsageError if it cannot be."""
    from trainrun.errors import UsageError

    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--output-dir {path}: cannot create it ({err.strerror})") from None
    if not os.access(path, os.W_OK):
        raise UsageError(f"--output-dir {path}: not writable")


class OutputSink:
    """Rank output to the console and --output-dir. `escape`: show terminal controls in rank lines as text
    (terminal_safe) on stdout and stderr; None (the default): on each of them that is a terminal now."""

    def __init__(self, prefix: str = "rank", output_dir: str | None = None, out=None, err=None, *,
                 show: frozenset[int] | None = None, folder: Folder | None = None, clock=time.monotonic,
                 escape: bool | None = None):
        if prefix not in PREFIXES:
            raise ValueError(f"prefix mode {prefix!r}")
        self.prefix = prefix
        self.show, self.folder, self._clock = show, folder, clock
        self.output_dir = output_dir
        self._files: dict[tuple[int, int], BinaryIO] = {}
        self._partial: dict[tuple[int, int], bytes] = {}
        self._tails: dict[int, deque] = {}
        self._out = {1: out or sys.stdout.buffer, 2: err or sys.stderr.buffer}
        self._safe = {s: _is_terminal(f) if escape is None else escape for s, f in self._out.items()}
        self.broken = False  # the reader of our stdout/stderr went away (e.g. `trainrun ... | head`)

    def _prefix(self, rank: int | str, stream: int) -> bytes:
        if self.prefix == "none":
            return b""
        job = b"1," if self.prefix.startswith("mpi") else b""
        tag = b"[%s%s]<%s>:" % (job, str(rank).encode(), STREAMS[stream].encode())
        if self.prefix.endswith("timestamp"):
            now = time.time()
            stamp = time.strftime("%H:%M:%S", time.localtime(now)) + ".%03d" % (int(now * 1000) % 1000)
            return stamp.encode() + b" " + tag
        return tag

    def feed(self, rank: int, stream: int, data: bytes) -> None:
        """Take a chunk of a rank's stream; `b""` means the stream ended."""
        if self.output_dir is not None:
            self._file(rank, stream).write(data)
        key = (rank, stream)
        buf = self._partial.pop(key, b"") + data
        if not data:  # EOF: whatever is left is the last line
            lines, rest = ([buf] if buf else []), b""
        else:
            *whole, rest = buf.split(b"\n")
            lines = [piece for line in whole for piece in _cut(line)]
            while len(rest) > MAX_LINE:
                lines.append(rest[:MAX_LINE])
                rest = rest[MAX_LINE:]
        if rest:
            self._partial[key] = rest
        if stream == 2 and lines:
            tail = self._tails.setdefault(rank, deque(maxlen=TAIL_LINES))
            tail.extend(self._tail_line(line) for line in lines)
        if self.show is not None and rank not in self.show:
            return
        if self.folder is not None:
            self._emit_folded(self.folder.feed(self._clock(), rank, stream, data))
            return
        if not lines:
            return
        prefix = self._prefix(rank, stream)
        self._emit_ranks(stream, b"".join(prefix + line + b"\n" for line in lines))

    def _tail_line(self, line: bytes) -> str:
        """A stderr line as the failure summary may print it (to the launcher's stderr: escaped if a terminal)."""
        line = line[:TAIL_LINE_CHARS]
        return (terminal_safe(line) if self._safe[2] else line).decode(errors="replace")

    def _emit_folded(self, folded: list[Folded]) -> None:
        from trainrun.rankset import format_ranks  # only with --fold (off the default launch path)

        for f in folded:
            self._emit_ranks(f.stream, self._prefix(format_ranks(f.ranks), f.stream) + f.text + b"\n")

    def _emit_ranks(self, stream: int, data: bytes) -> None:
        """Write whole lines of rank output (escaped where the stream is a terminal)."""
        self._emit(stream, terminal_safe(data) if self._safe[stream] else data)

    def tick(self) -> None:
        """Release folded lines whose window has passed (called from the job's loop)."""
        if self.folder is not None:
            self._emit_folded(self.folder.tick(self._clock()))

    def _emit(self, stream: int, data: bytes) -> None:
        if self.broken:
            return
        try:
            self._out[stream].write(data)
            self._out[stream].flush()
        except BrokenPipeError:
            self.broken = True

    def write_raw(self, stream: int, data: bytes) -> None:
        """Write launcher-side text (not a rank's) to the launcher's stdout (1) or stderr (2) as is."""
        self._emit(stream, data)

    def flush_all(self) -> None:
        """Write every partial line (used at teardown when some pipes never reached EOF)."""
        for rank, stream in list(self._partial):
            self.feed(rank, stream, b"")
        if self.folder is not None:
            self._emit_folded(self.folder.close())
        for f in self._files.values():
            f.flush()

    def stderr_tail(self, rank: int) -> list[str]:
        return list(self._tails.get(rank, ()))

    def _file(self, rank: int, stream: int) -> BinaryIO:
        key = (rank, stream)
        f = self._files.get(key)
        if f is None:
            assert self.output_dir is not None  # files are written only with --output-dir
            d = os.path.join(self.output_dir, f"rank.{rank}")
            os.makedirs(d, exist_ok=True)
            f = self._files[key] = open(os.path.join(d, STREAMS[stream]), "wb")
        return f

    def close(self) -> None:
        self.flush_all()
        for f in self._files.values():
            f.close()
        self._files.clear()


class OutputOptions(NamedTuple):  # (not a dataclass: see plan/planner.py's note)
    """What the user asked of a job's output, resolved once (launchspec.resolve): --prefix, --output-dir,
    --fold, --ranks (`show_ranks`, None: every rank), and the live views --monitor and --json (for a running
    job: JSON events; for --dry-run and --check: the printout as JSON)."""

    prefix: str = "rank"
    output_dir: str | None = None
    fold: bool = False
    show_ranks: frozenset[int] | None = None
    monitor: bool = False
    json: bool = False

    def shown(self, size: int) -> frozenset[int] | None:
        """--ranks (None: every rank); UsageError if it names a rank >= size (the job's size is known late)."""
        ranks = self.show_ranks
        if ranks is not None and (beyond := [r for r in ranks if r >= size]):
            from trainrun.rankset import format_ranks

            raise UsageError(f"--ranks {format_ranks(ranks)}: the job has ranks 0-{size - 1}, not {format_ranks(beyond)}")
        return ranks


def sink_for(opts: OutputOptions, size: int) -> OutputSink:
    """The console and --output-dir writer of a job of `size` ranks, as the options ask: --prefix, --ranks,
    --fold. (Raises UsageError for a --ranks beyond the job.)"""
    show = opts.shown(size)
    folder = None
    if opts.fold:
        from trainrun.supervisor.fold import Folder

        folder = Folder(sorted(show) if show is not None else range(size))
    return OutputSink(opts.prefix, opts.output_dir, show=show, folder=folder)
