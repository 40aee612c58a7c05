"""The rank's side of in-flight diagnosis, installed by the runtime's init() (one call in runtime/state.py).

It talks to the process that started the rank (the launcher for its own host, the agent elsewhere) over
the rank's *diag pipe*: the write end of a pipe that process passed down, named by TRAINRUN_DIAG_FD as
"FD:INODE" (the inode tells the real pipe from an unrelated file that reuses the number in a grandchild).
No port is opened and nothing is sent over the network by the rank itself. Lines, each shorter than
PIPE_BUF so that the kernel writes them whole; the pipe is non-blocking and a line that does not fit
is dropped (diagnosis must never block training):

    hook PID MAIN_IDENT PATH   faulthandler is registered on SIGUSR2 and appends all threads' stacks to
                               PATH: the fallback for hosts where py-spy cannot attach (no ptrace)
    progress N                 the runtime has made N collective calls (sent when N changed, at most
                               every PROGRESS_EVERY_S): what --hang-timeout counts besides output
    stall                      the runtime raised a StallError here: the launcher takes every rank's stack

The StallError notice wraps StallError.__init__ (the runtime raises it from its engine), so the runtime
itself needs no change beyond the install call. Outside a trainrun launch (no TRAINRUN_DIAG_FD) install()
does nothing: SIGUSR2 keeps its default meaning.
"""
from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import stat
import tempfile
import threading
import time

ENV = "TRAINRUN_DIAG_FD"
PROGRESS_EVERY_S = 1.0
STALL_EVERY_S = 10.0

_fd: int | None = None
_installed = False
_engine = None  # the engine whose progress is reported (the latest init's)
_last_stall = 0.0


def diag_fd(value: str | None) -> int | None:
    """The diag pipe named by TRAINRUN_DIAG_FD's value, if it is really open here; else None."""
    try:
        fd_text, ino_text = (value or "").split(":")
        fd = int(fd_text)
        st = os.fstat(fd)
    except (ValueError, OSError):
        return None
    return fd if stat.S_ISFIFO(st.st_mode) and st.st_ino == int(ino_text) else None


def send(line: str) -> None:
    """One line to the owner; dropped if there is no pipe or it is full."""
    if _fd is None:
        return
    try:
        os.write(_fd, line.encode()[:500] + b"\n")
    except (BlockingIOError, OSError):
        pass


def install(engine=None) -> None:
    """Register the faulthandler fallback, announce it, report progress of `engine` (anything with a
    `reductions` count) and StallErrors. Idempotent; never raises."""
    global _fd, _installed, _engine
    if engine is not None and hasattr(engine, "reductions"):
        _engine = engine
    if _installed:
        return
    _installed = True
    _fd = diag_fd(os.environ.get(ENV))
    if _fd is None:
        return
    try:
        os.set_blocking(_fd, False)
        rank = os.environ.get("RANK", "x")
        handle, path = tempfile.mkstemp(prefix=f"trainrun-stacks-{rank}-", suffix=".txt")
        f = os.fdopen(handle, "a")
        faulthandler.register(signal.SIGUSR2, file=f, all_threads=True)
        atexit.register(_remove, path, os.getpid())
        send(f"hook {os.getpid()} {threading.main_thread().ident} {path}")
    except OSError:
        pass
    _watch_stalls()
    threading.Thread(target=_report_progress, name="trainrun-diag", daemon=True).start()


def _remove(path: str, pid: int) -> None:
    if os.getpid() == pid:  # not in a forked child that inherited the atexit hook
        try:
            os.unlink(path)
        except OSError:
            pass


def _watch_stalls() -> None:
    from trainrun.runtime import exceptions

    original = exceptions.StallError.__init__

    def __init__(self, *args, **kwargs):
        global _last_stall
        original(self, *args, **kwargs)
        now = time.monotonic()
        if now - _last_stall >= STALL_EVERY_S:
            _last_stall = now
            send("stall")

    exceptions.StallError.__init__ = __init__


def _report_progress() -> None:
    last = None
    while True:
        time.sleep(PROGRESS_EVERY_S)
        try:
            n = (id(_engine), _engine.reductions) if _engine is not None else None
        except Exception:  # an engine being torn down: try again next time
            continue
        if n is not None and n != last:
            last = n
            send(f"progress {n[1]}")
