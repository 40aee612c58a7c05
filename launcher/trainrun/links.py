"""Channels to a host agent. `AgentLink` is the shape AgentRanks needs; SSHLink runs the agent over one
paramiko session (no pty: the agent's stdin EOF, not SIGHUP, tells it the launcher is gone); PipeLink
runs it as a local subprocess (tests of the agent protocol).
"""
from __future__ import annotations

import os
import subprocess
from typing import Protocol


class AgentLink(Protocol):
    host: str

    def fileno(self) -> int: ...
    def read(self) -> tuple[bytes, bytes, bool]: ...  # (stdout bytes, stderr bytes, ended)
    def write(self, data: bytes) -> None: ...
    def shutdown(self) -> None: ...             # EOF to the agent: it kills what is left and exits
    def wait(self, timeout: float) -> None: ... # until the agent has ended (or timeout)
    def disconnect(self) -> None: ...

    def close(self, wait: float) -> None: ...   # shutdown, then wait


class PipeLink:
    """An agent as a local subprocess (pipes instead of SSH)."""

    peer_address = local_address = "127.0.0.1"

    def __init__(self, host: str, argv: list[str]):
        self.host = host
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for f in (self.proc.stdout, self.proc.stderr):
            os.set_blocking(f.fileno(), False)

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def read(self) -> tuple[bytes, bytes, bool]:
        out = _read_available(self.proc.stdout.fileno())
        err = _read_available(self.proc.stderr.fileno())
        return out or b"", err or b"", out == b""

    def write(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def shutdown(self) -> None:
        try:
            self.proc.stdin.close()
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


def _read_available(fd: int) -> bytes | None:
    """What can be read without blocking: bytes, b"" at EOF, None when nothing is there yet."""
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None


class SSHLink:
    """An agent started over one SSH session (paramiko). The session has no pty: the agent's stdin
    EOF, not SIGHUP, is what tells it the launcher is gone."""

    def __init__(self, host: str, client, command: str):
        self.host = host
        self.client = client
        transport = client.get_transport()
        self.peer_address = transport.getpeername()[0]
        self.local_address = transport.sock.getsockname()[0]
        self.channel = transport.open_session()
        self.channel.exec_command(command)

    def fileno(self) -> int:
        return self.channel.fileno()

    def read(self) -> tuple[bytes, bytes, bool]:
        ch, out, err = self.channel, bytearray(), bytearray()
        while ch.recv_ready():
            out += ch.recv(1 << 16)
        while ch.recv_stderr_ready():
            err += ch.recv_stderr(1 << 16)
        ended = (ch.eof_received or ch.closed) and not ch.recv_ready()
        return bytes(out), bytes(err), ended

    def write(self, data: bytes) -> None:
        try:
            self.channel.sendall(data)
        except OSError:
            pass  # the channel is gone; read() reports it

    def shutdown(self) -> None:
        try:
            self.channel.shutdown_write()
        except OSError:
            pass

    def wait(self, timeout: float) -> None:
        self.channel.status_event.wait(timeout)
        self.channel.close()

    def close(self, wait: float) -> None:
        self.shutdown()
        self.wait(wait)

    def disconnect(self) -> None:
        self.client.close()
