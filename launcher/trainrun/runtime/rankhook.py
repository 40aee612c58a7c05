"""The rank's side of in-flight diagnosis, installed by the runtime's init() (one call in runtime/lifecycle.py).

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
    stall RANKS S NAMES        the runtime raised a StallError here: RANKS ("1", "0-3,5") did not submit
                               NAMES ("'x'", "'a', 'b' and 3 more") within the stall timeout S; the
                               launcher takes every rank's stack and ends the job naming them,
                               unless a raising rank makes progress again soon after (it caught
                               the error and the absent rank came back: supervisor/job.py)
    perf WALL WAIT COLL LAST STEPS BEFORE BYTES RSS GPU
                               every wire/perf_line.WINDOW_S: the window's collectives, time and memory (9
                               fields), for straggler detection and the live view (supervisor/straggler.py,
                               supervisor/monitor.py); wire/perf_line.py says what each field is
    stuck S WHAT               this rank has waited S seconds in WHAT ("allreduce 'x'") and no collective
                               round completed meanwhile: some peer's engine takes no part at all (it is
                               stopped, exited, in MPI_Finalize, or hung outside trainrun), a wait that
                               nothing inside the ranks can end. The launcher names the peer and ends the job.

The stuck watchdog runs in this module's thread (once a second, reading counters the engine keeps
anyway: Engine.liveness), so the collectives' own path does no extra work for it. Its limit is the
stall timeout while a round is in flight (a live peer joins one within milliseconds); inside a data
transfer, the stall timeout plus the transfer's bytes at SLOWEST_TRANSFER_BPS (a single large transfer
may legitimately take long; its size is read from the waiting thread's frames only then); elsewhere
(a negotiation phase, a GPU transfer) STUCK_OTHER_FACTOR times the stall timeout.

The StallError notice wraps StallError.__init__ (the runtime raises it from its engine), so the runtime
itself needs no change beyond the install call. Outside a trainrun launch (no TRAINRUN_DIAG_FD) install()
does nothing: SIGUSR2 keeps its default meaning. The pipe's name and the stack-file directory
(TRAINRUN_DIAG_FD, TRAINRUN_STACKS_DIR) come from the runtime's settings (runtime/horovod_env.py), which
init() hands to install(); this module reads no environment. The engines it watches are the current
session's (runtime/context.RUNTIME), looked up at each look, so a later init's are watched too.
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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainrun.runtime.engine import Engine

ENV = "TRAINRUN_DIAG_FD"  # (read by runtime/horovod_env.py; the launcher sets it: supervisor/local.py)
PROGRESS_EVERY_S = 1.0
SLOWEST_TRANSFER_BPS = 10e6  # bytes/s: a transfer slower than this counts as stuck (1 GbE moves ~100e6)
STUCK_OTHER_FACTOR = 4

# Process-wide, not per session, on purpose: the diag pipe is an fd the process inherited, the faulthandler
# registration on SIGUSR2 and the diag thread are the process's, and they outlive shutdown() and a later
# init() (which finds them installed). Written once, by the first install().
_fd: int | None = None
_installed = False


def diag_fd(value: str | None) -> int | None:
    """The diag pipe named by TRAINRUN_DIAG_FD's value, if it is really open here; else None."""
    try:
        fd_text, ino_text = (value or "").split(":")
        fd = int(fd_text)
        st = os.fstat(fd)
    except (ValueError, OSError):
        return None
    return fd if stat.S_ISFIFO(st.st_mode) and st.st_ino == int(ino_text) else None


def connected() -> bool:
    """Whether a launcher's diag pipe is open here (install() found TRAINRUN_DIAG_FD's pipe)."""
    return _fd is not None


def send(line: str) -> None:
    """One line to the owner; dropped if there is no pipe or it is full."""
    if _fd is None:
        return
    try:
        os.write(_fd, line.encode()[:500] + b"\n")
    except (BlockingIOError, OSError):
        pass


def install(pipe: str | None, stacks_dir: str | None, rank: int) -> None:
    """On the diag pipe named `pipe` (TRAINRUN_DIAG_FD's "FD:INODE"; None, or not really open here: nothing
    is installed), register the faulthandler fallback writing to a file in `stacks_dir` (None: the temporary
    directory) named after `rank`, announce it, and report the session's progress, windows, stuck waits and
    StallErrors. Idempotent (the first call's pipe counts: it is the process's); never raises."""
    global _fd, _installed
    if _installed:
        return
    _installed = True
    _fd = diag_fd(pipe)
    if _fd is None:
        return
    try:
        os.set_blocking(_fd, False)
        # in the job's directory on this host, which its owner removes after the ranks (diag/stacks.py): a
        # SIGKILLed rank never runs the atexit removal below; without one (no owner), the temporary directory
        where = stacks_dir
        handle, path = tempfile.mkstemp(prefix=f"trainrun-stacks-{rank}-", suffix=".txt", dir=where)
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
        original(self, *args, **kwargs)
        line = stall_line(self)
        if line:  # (one the runtime raised: a program's own StallError says nothing; the launcher
            send(line)  # de-duplicates, and a program that recovered may stall again: every one is sent)

    exceptions.StallError.__init__ = __init__  # type: ignore[method-assign]  # (wrapped on purpose: see above)


def stall_line(error) -> str | None:
    """The `stall` notice for a StallError (the module docstring's grammar); None if it names no rank."""
    from trainrun.rankset import format_ranks

    if not error.absent:
        return None
    names = ", ".join(f"'{n}'" for n in error.names[:3]) or "a collective"
    if len(error.names) > 3:
        names += f" and {len(error.names) - 3} more"
    return f"stall {format_ranks(error.absent)} {error.seconds:g} {names}"


def _report_progress() -> None:
    last = None
    watch = StuckWatch()
    window = None  # (engine id, perf.Counters at the window's start)
    while True:
        time.sleep(PROGRESS_EVERY_S)
        try:
            window = _report_window(window)
        except Exception:  # an engine being torn down: start a new window next time
            window = None
        try:
            stuck = watch.check(_engines(), time.monotonic())
        except Exception:  # engines being torn down: look again next time
            stuck = None
        if stuck is not None:
            send(f"stuck {stuck}")
        engine = _global_engine()
        try:
            n = (id(engine), engine.reductions) if engine is not None else None
        except Exception:  # an engine being torn down: try again next time
            continue
        if n is not None and n != last:
            last = n
            send(f"progress {n[1]}")


def _report_window(window):
    """Send a `perf` line (wire/perf_line.py) when the window begun at `window` is WINDOW_S old; the new window."""
    from trainrun.wire import perf_line as perf

    engine = _global_engine()
    now = time.perf_counter_ns()
    counters = perf.read(engine, now) if engine is not None else None
    if counters is None:
        return None
    if window is None or window[0] != id(engine):
        return id(engine), counters
    if now - window[1].t_ns < perf.WINDOW_S * 1e9:
        return window
    text = perf.line(window[1], counters)
    if text:
        send(text)
    return id(engine), counters


def _global_engine() -> Engine | None:
    """The current session's engine of the global set (whose progress and windows are reported), if any."""
    from trainrun.runtime.context import RUNTIME

    session = RUNTIME.session
    return session.engines.get(0) if session is not None else None


def _engines() -> list[Engine]:
    """This rank's engines (the global set's and its process sets'), none outside a session."""
    from trainrun.runtime.context import RUNTIME

    session = RUNTIME.session
    return list(session.engines.values()) if session is not None else []


class StuckWatch:
    """Finds an engine that waits while no round completes (see the module docstring). `check` is
    given the engines and the time, once a second; it returns "SECONDS WHAT" the first time an engine
    has been stuck past its limit (once per stuck spell), else None."""

    def __init__(self):
        self._seen: dict[int, tuple] = {}  # id(engine) -> (its liveness counters, since when, reported)

    def check(self, engines, now: float) -> str | None:
        seen, self._seen = self._seen, {}
        found = None
        for engine in engines:
            live = engine.liveness()
            if live is None:
                continue
            counters, in_round = live[:2], live[2]
            before = seen.get(id(engine))
            if before is None or before[0] != counters:
                self._seen[id(engine)] = (counters, now, False)
                continue
            since, reported = before[1], before[2]
            if not reported and found is None and now - since >= engine.stall_timeout \
                    and now - since >= self._limit(engine, in_round):
                found = f"{now - since:.0f} {engine.waiting_on()}"
                reported = True
            self._seen[id(engine)] = (counters, since, reported)
        return found

    @staticmethod
    def _limit(engine, in_round: bool) -> float:
        """How long `engine` may wait with no round completing (see the module docstring)."""
        if in_round:
            return engine.stall_timeout
        transfers = engine.transfers_in_progress()
        if transfers:
            return engine.stall_timeout + max(transfers) / SLOWEST_TRANSFER_BPS
        return engine.stall_timeout * STUCK_OTHER_FACTOR
