"""A fan-out engine whose "hosts" are local subprocesses (pipes instead of SSH): the agent protocol
and the launcher's remote path, tested without a network. Every host name is reachable; each agent
and module runs with this machine's Python."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import IO

from trainrun.errors import HostError
from trainrun.plan.hosts import HostSpec


class PipeLink:
    """An agent as a local subprocess."""

    peer_address = local_address = "127.0.0.1"

    def __init__(self, host: str, argv: list[str], new_session: bool = False):
        self.host = host
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=new_session)
        self.stdin, self.stdout, self.stderr = _pipes(self.proc)
        for f in (self.stdout, self.stderr):
            os.set_blocking(f.fileno(), False)

    def fileno(self) -> int:
        return self.stdout.fileno()

    def read(self) -> tuple[bytes, bytes, bool]:
        out = _read_available(self.stdout.fileno())
        err = _read_available(self.stderr.fileno())
        return out or b"", err or b"", out == b""

    def write(self, data: bytes) -> None:
        try:
            self.stdin.write(data)
            self.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def shutdown(self) -> None:
        try:
            self.stdin.close()
        except BrokenPipeError:
            pass

    def wait(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def close(self, wait: float) -> None:
        self.shutdown()
        self.wait(wait)

    def disconnect(self) -> None:
        pass

    def why_ended(self) -> str | None:
        """A local pipe's end says nothing of why (the agent's exit shows in its stderr)."""
        return None


def _pipes(proc: subprocess.Popen[bytes]) -> tuple[IO[bytes], IO[bytes], IO[bytes]]:
    """The stdin, stdout and stderr of a process started with all three as PIPEs."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    return proc.stdin, proc.stdout, proc.stderr


def _read_available(fd: int) -> bytes | None:
    """What can be read without blocking: bytes, b"" at EOF, None when nothing is there yet."""
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None


class PipeModuleChannel:
    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.stdin, self.stdout, self.stderr = _pipes(self.proc)

    def readline(self) -> bytes:
        return self.stdout.readline()

    def read(self) -> bytes:
        return self.stdout.read()

    def send(self, data: bytes) -> None:
        self.stdin.write(data)
        self.stdin.flush()

    def close_stdin(self) -> None:
        self.stdin.close()

    def exit_status(self) -> int:
        return self.proc.wait()

    def stderr_text(self) -> str:
        return self.stderr.read().decode(errors="replace") if self.proc.poll() is not None else ""

    def close(self) -> None:
        for f in (self.stdin, self.stdout, self.stderr):
            try:
                f.close()
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class PipeEngine:
    """FanoutEngine running every host's agent as a child of this process."""

    name = "pipe"
    reaches_local = False

    def reach(self, hosts: list[HostSpec]) -> dict[str, HostError]:
        return {}

    def start_agent(self, host: str) -> PipeLink:
        return PipeLink(host, [sys.executable, "-m", "trainrun.agent"])

    def run_module(self, host: str, module: str, *args: str, python: str | None = None,
                   timeout: float = 30.0) -> PipeModuleChannel:
        return PipeModuleChannel([python or sys.executable, "-m", module, *args])

    def sweep(self, host: str, job_id: str, mark_host: str, agent: str | None) -> str | None:
        """Clean up a lost "host" as SSHEngine.sweep does, with a new local process (supervisor/reaper.py)."""
        p = subprocess.run([sys.executable, "-m", "trainrun.supervisor.reaper", job_id, mark_host, *([agent] if agent else [])],
                           capture_output=True, text=True, timeout=30)
        return None if p.returncode == 0 else f"processes left after the cleanup: {p.stdout.strip() or p.stderr.strip()}"

    def close(self) -> None:
        pass
