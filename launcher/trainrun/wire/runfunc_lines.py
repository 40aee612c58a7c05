"""How a call travels to the ranks and each rank's outcome back, with no port and no shared disk.

To the ranks: the call (func, args, kwargs, the caller's sys.path), cloudpickled -- functions of
`__main__` (a script, a Jupyter cell) by value -- in the launcher's environment, which trainrun hands to
every rank on every host (TRAINRUN_* variables are forwarded over SSH/srun): base64 in pieces of
ENV_PIECE characters (under Linux's 128 KiB limit per variable), at most MAX_ENV_BYTES in all (the
environment and argv of one process share ~2 MiB). A bigger call of a job on this machine only goes
through a file in a private temporary folder instead (TRAINRUN_RUN_FILE).

Back from the ranks: a rank on the caller's machine streams its return value through a Unix socket in the
call's private folder (channel.py, TRAINRUN_RUN_SOCKET): one copy, any size. Everything else -- errors,
and values of ranks on other hosts -- is printed on the rank's stdout as lines
    <MARK> <nonce> <attempt> <rank> <piece> <pieces> <base64>
which the launcher prefixes (`[rank]<stdout>:`) and passes on like any output (from another host: through
its agent's channel); the caller takes them out of the stream (the nonce is per call, so a program's own
output never matches). That way holds a few copies of the value in the rank and the caller and base64 is
4/3 of it, so it takes at most `max_lines_bytes()` (REMOTE_RESULT_MB, 64 MiB by default; TRAINRUN_RUN_REMOTE_RESULT_MB
in the caller's environment changes it): above it the rank sends ("too big", size, limit, host) instead.
An outcome is ("ok", value, world size), ("error", RankFailure) or ("too big", bytes, limit bytes, host).
"""
from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass

MARK = "\x1etrainrun-result"
ENV_NONCE = "TRAINRUN_RUN_NONCE"
ENV_PIECES = "TRAINRUN_RUN_PIECES"      # how many TRAINRUN_RUN_PIECE_<i> variables hold the call
ENV_PIECE = "TRAINRUN_RUN_PIECE_"
ENV_FILE = "TRAINRUN_RUN_FILE"
ENV_SOCKET = "TRAINRUN_RUN_SOCKET"      # the caller's ResultServer (channel.py), for ranks on its machine
ENV_REMOTE_MB = "TRAINRUN_RUN_REMOTE_RESULT_MB"
REMOTE_RESULT_MB = 64                   # the largest pickled outcome sent as lines (from other hosts), MiB
PIECE_CHARS = 100_000
MAX_ENV_BYTES = 1 << 20                 # base64 characters of the call in the environment
LINE_CHARS = 32_000                     # base64 characters per result line (trainrun cuts lines at 64 KiB;
                                        # a multiple of 4, so each piece decodes alone)
_PREFIX = re.compile(rb"^\[(\d+)\]<stdout>:")


@dataclass(frozen=True)
class RankFailure:
    """What a rank's exception leaves: where, what, and the rank's own traceback text. `exception` is the
    exception object when it pickles (None otherwise)."""

    rank: int
    host: str
    type_name: str
    message: str
    traceback: str
    exception: BaseException | None = None


def call_env(blob: bytes) -> dict[str, str] | None:
    """The variables that carry `blob` to the ranks; None when it is too big for the environment."""
    text = base64.b64encode(blob).decode()
    if len(text) > MAX_ENV_BYTES:
        return None
    pieces = [text[i:i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)] or [""]
    return {ENV_PIECES: str(len(pieces)), **{f"{ENV_PIECE}{i}": p for i, p in enumerate(pieces)}}


def read_call(environ) -> bytes:
    """The call's bytes, from the environment or TRAINRUN_RUN_FILE (inside a rank)."""
    if ENV_FILE in environ:
        with open(environ[ENV_FILE], "rb") as f:
            return f.read()
    n = int(environ[ENV_PIECES])
    return base64.b64decode("".join(environ[f"{ENV_PIECE}{i}"] for i in range(n)))


def max_lines_bytes(environ) -> int:
    """The largest pickled outcome a rank sends as lines: TRAINRUN_RUN_REMOTE_RESULT_MB (MiB, may be a
    fraction) if set and valid, else REMOTE_RESULT_MB."""
    try:
        mb = float(environ.get(ENV_REMOTE_MB, REMOTE_RESULT_MB))
    except ValueError:
        mb = REMOTE_RESULT_MB
    return int(max(mb, 0) * (1 << 20))


def outcome_lines(nonce: str, attempt: int, rank: int, blob: bytes) -> bytes:
    """A rank's pickled outcome as the lines it prints."""
    text = base64.b64encode(blob).decode()
    pieces = [text[i:i + LINE_CHARS] for i in range(0, len(text), LINE_CHARS)] or [""]
    return "".join(f"{MARK} {nonce} {attempt} {rank} {i} {len(pieces)} {p}\n" for i, p in enumerate(pieces)).encode()


class Collector:
    """Takes the launcher's stdout line by line: `feed(line)` returns what to show (None: nothing; the
    outcome lines of this call are kept). `outcomes()`: {(attempt, rank): pickled outcome} once whole,
    `order`: the (attempt, rank) keys in the order they completed."""

    def __init__(self, nonce: str):
        self.mark = f"{MARK} {nonce} ".encode()
        self._pieces: dict[tuple[int, int], dict[int, bytes]] = {}
        self._whole: dict[tuple[int, int], bytes] = {}
        self.order: list[tuple[int, int]] = []

    def feed(self, line: bytes) -> bytes | None:
        at = line.find(self.mark)
        if at < 0:
            return line
        m = _PREFIX.match(line)
        try:
            attempt, rank, index, count, text = line[at + len(self.mark):].rstrip(b"\n").split(b" ", 4)
            key, i, n = (int(attempt), int(rank)), int(index), int(count)
        except ValueError:
            return line
        got = self._pieces.setdefault(key, {})
        got[i] = base64.b64decode(text)  # decoded as it comes (pieces are whole base64 quanta): 3/4 of the text kept
        if len(got) == n:
            self._whole[key] = b"".join(got[j] for j in range(n))
            del self._pieces[key]
            self.order.append(key)
        before = line[m.end() if m else 0:at]
        if before:  # the rank's own partial line, ended by our line: show it
            return line[:at] + b"\n"
        return None

    def outcomes(self) -> dict[tuple[int, int], bytes]:
        return dict(self._whole)


def private_file(folder: str, blob: bytes) -> str:
    """Write `blob` to a file only this user can read; returns its path."""
    path = os.path.join(folder, "call.pkl")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(blob)
    return path
