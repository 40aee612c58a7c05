"""The hosts of an elastic job over time: a fixed list (-H/--hostfile), or a host discovery script
(Horovod's contract: an executable that prints the hosts available now, one `host:slots` or `host` per
line) run every DISCOVERY_EVERY s on a background thread, so a slow script never stalls the job.
"""
from __future__ import annotations

import subprocess
import threading

from trainrun import log
from trainrun.errors import UsageError
from trainrun.plan.hosts import HostSpec, parse_hosts_arg

DISCOVERY_EVERY = 1.0
SCRIPT_TIMEOUT = 30.0


def run_script(path: str) -> list[HostSpec]:
    """The hosts `path` lists now. Raises UsageError naming the script and what went wrong."""
    try:
        r = subprocess.run([path], capture_output=True, text=True, timeout=SCRIPT_TIMEOUT, stdin=subprocess.DEVNULL)
    except OSError as err:
        raise UsageError(f"--host-discovery-script {path}: cannot run it ({err.strerror}); it must be an executable file") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"--host-discovery-script {path}: no answer within {SCRIPT_TIMEOUT:g}s") from None
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"--host-discovery-script {path}: exited with code {r.returncode} ({last})")
    entries = [line.strip() for line in r.stdout.splitlines() if line.strip() and not line.startswith("#")]
    if not entries:
        return []
    try:
        return parse_hosts_arg(",".join(entries))
    except UsageError as err:
        raise UsageError(f"--host-discovery-script {path}: {err}") from None


class LiveHosts:
    """`current()`: the hosts available now. Fixed hosts, or the discovery script's latest good answer
    (a failing run keeps the previous answer and logs a warning)."""

    def __init__(self, fixed: list[HostSpec] | None = None, script: str | None = None):
        self.script = script
        self._hosts = list(fixed or [])
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if script:
            self._hosts = run_script(script)  # the first answer decides the first attempt; errors end the launch
            self._thread = threading.Thread(target=self._loop, name="trainrun-discovery", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        assert self.script is not None  # the loop runs only for a discovery script
        while not self._stop.wait(DISCOVERY_EVERY):
            try:
                hosts = run_script(self.script)
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
