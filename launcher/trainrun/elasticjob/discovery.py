"""The hosts of an elastic job over time: a fixed list (-H/--hostfile), or a host discovery script
(Horovod's contract: an executable that prints the hosts available now, one `host:slots` or `host` per
line) run every DISCOVERY_EVERY s on a background thread, so a slow script never stalls the job.
"""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from trainrun import log
from trainrun.errors import UsageError
from trainrun.plan.hosts import MAX_HOSTFILE_BYTES, HostSpec, parse_hosts_arg

DISCOVERY_EVERY = 1.0
SCRIPT_TIMEOUT = 30.0
STDERR_KEPT = 4096  # bytes of the script's stderr kept for the message (its last line)


def run_script(path: str) -> list[HostSpec]:
    """The hosts `path` lists now. Raises UsageError naming the script and what went wrong: it cannot
    run, gives no answer within SCRIPT_TIMEOUT, fails, or prints more than a hostfile may hold
    (MAX_HOSTFILE_BYTES: its answer is read within that bound, the script killed past it)."""
    try:
        rc, out, err = _bounded_run(path)
    except OSError as e:
        raise UsageError(f"--host-discovery-script {path}: cannot run it ({e.strerror}); it must be an executable file") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"--host-discovery-script {path}: no answer within {SCRIPT_TIMEOUT:g}s") from None
    if out is None:
        raise UsageError(f"--host-discovery-script {path}: printed more than {MAX_HOSTFILE_BYTES >> 20} MiB; "
                         "it must print the hosts available now, one host:slots a line")
    if rc != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"--host-discovery-script {path}: exited with code {rc} ({last})")
    lines = out.decode(errors="replace").splitlines()
    entries = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    if not entries:
        return []
    try:
        return parse_hosts_arg(",".join(entries))
    except UsageError as e:
        raise UsageError(f"--host-discovery-script {path}: {e}") from None


def _bounded_run(path: str) -> tuple[int, bytes | None, bytes]:
    """Run `path`: (exit code, its stdout or None if it printed more than MAX_HOSTFILE_BYTES, the tail of its
    stderr). It is killed past that bound or SCRIPT_TIMEOUT (then TimeoutExpired); OSError if it cannot start."""
    # its own process group: what it started goes with it when it is killed
    proc = subprocess.Popen([path], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)

    def kill() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # (the whole group ended meanwhile)
            pass

    out, err, too_much = bytearray(), bytearray(), False
    deadline = time.monotonic() + SCRIPT_TIMEOUT
    with proc, selectors.DefaultSelector() as sel:
        assert proc.stdout is not None and proc.stderr is not None
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        while sel.get_map() and not too_much:
            left = deadline - time.monotonic()
            if left <= 0:
                kill()
                raise subprocess.TimeoutExpired(path, SCRIPT_TIMEOUT)
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if key.data is err:
                    del err[:-STDERR_KEPT]
                too_much = len(out) > MAX_HOSTFILE_BYTES
        if too_much:
            kill()
        try:
            rc = proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:  # it closed its output but runs on
            kill()
            raise
    return rc, None if too_much else bytes(out), bytes(err)


class LiveHosts:
    """`current()`: the hosts available now. `first`: the hosts to start with: the fixed -H/--hostfile list, or
    the discovery script's first answer (run once by the launch step, launchspec.resolve, whose errors end the
    launch). With `script`, it runs again every DISCOVERY_EVERY s from then on, and `current()` is its latest
    good answer (a failing run keeps the previous answer and logs a warning)."""

    def __init__(self, first: list[HostSpec] | None = None, script: str | None = None,
                 poll: Callable[[], list[HostSpec]] | None = None):
        """`poll`: asked instead of a script (the Ray engine's placement group: `--ray`), on the same thread."""
        self.script = script
        self._poll = poll
        self._hosts = list(first or [])
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if script or poll:
            self._thread = threading.Thread(target=self._loop, name="trainrun-discovery", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(DISCOVERY_EVERY):
            try:
                hosts = self._poll() if self._poll is not None else run_script(str(self.script))
            except UsageError as err:
                log.warning("%s", err)
                continue
            with self._lock:
                self._hosts = hosts

    def current(self) -> list[HostSpec]:
        with self._lock:
            return list(self._hosts)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(SCRIPT_TIMEOUT)
