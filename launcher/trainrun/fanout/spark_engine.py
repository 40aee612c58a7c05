"""The Spark fan-out engine: every remote host's agent runs under one of the job's Spark barrier tasks, on the
socket that task opened back to the driver (wire/spark_link.py). The driver (sparkrun/driver.py) accepted and
authenticated those sockets before it started this launcher, which inherits them (ENV_LINKS names the fds):
the engine opens nothing and listens on nothing.

    start_agent(host)   one START_AGENT byte: the task runs `python -m trainrun.agent` with the socket as its
                        stdin and stdout; the link is that socket. Once per host (a task's socket is one channel)
    run_module          not possible (no second channel to a task): the driver pins the NIC instead
                        (--network-interface, the NIC every task reached the driver by)
    sweep               not possible either: a lost host's agent ends its ranks by its own rules (channel EOF,
                        SIGTERM from its dying task through PR_SET_PDEATHSIG), and Spark ends the stage's tasks
    close()             closes every socket: an unused task (this machine's host) sees EOF and ends
"""
from __future__ import annotations

import os
import select
import socket
import time
from collections.abc import Mapping

from trainrun.errors import HostError
from trainrun.plan.hosts import HostSpec
from trainrun.wire.spark_link import ENV_LINKS, START_AGENT, parse_links


class SocketLink:
    """An agent on the far end of a Spark task's socket."""

    def __init__(self, host: str, sock: socket.socket):
        self.host, self.sock = host, sock
        self.peer_address = sock.getpeername()[0]
        self.local_address = sock.getsockname()[0]
        self._ended = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> tuple[bytes, bytes, bool]:
        if self._ended:
            return b"", b"", True
        try:
            out = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return b"", b"", False
        except OSError:
            out = b""
        self._ended = out == b""
        return out, b"", self._ended   # the agent's stderr goes to the executor's log

    def write(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            pass   # the task is gone: the read side sees the end

    def shutdown(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def wait(self, timeout: float) -> None:
        """Until the agent has closed its end (EOF), reading and dropping what it still sends; then close."""
        deadline = time.monotonic() + timeout
        while not self._ended and (left := deadline - time.monotonic()) > 0:
            try:
                ready, _, _ = select.select([self.sock], [], [], left)
            except (OSError, ValueError):
                break
            if ready:
                self.read()
        self.sock.close()

    def close(self, wait: float) -> None:
        self.shutdown()
        self.wait(wait)

    def disconnect(self) -> None:
        pass

    def why_ended(self) -> str | None:
        """The task's socket says nothing of why (Spark's log of the stage does)."""
        return None


class SparkEngine:
    """FanoutEngine over the sockets of a Spark job's tasks: {host: connected socket}."""

    name = "spark"
    reaches_local = False

    def __init__(self, socks: Mapping[str, socket.socket]):
        self._socks = dict(socks)
        self._links: list[SocketLink] = []

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SparkEngine:
        links = parse_links(environ.get(ENV_LINKS, ""))
        socks = {host: socket.socket(fileno=fd) for host, fd in links.items()}
        for fd in links.values():
            os.set_inheritable(fd, False)   # not for the ranks this launcher starts
        return cls(socks)

    def reach(self, hosts: list[HostSpec]) -> dict[str, HostError]:
        return {h.name: HostError(h.name, "spark", "no Spark task of this job runs there",
                                  hint="hosts come from the Spark stage's tasks") for h in hosts
                if h.name not in self._socks}

    def start_agent(self, host: str) -> SocketLink:
        sock = self._socks.pop(host, None)
        if sock is None:
            raise HostError(host, "spark", "its Spark task's channel is used already (one agent per task)",
                            hint="a Spark job's hosts cannot be reached again; run the job again")
        try:
            sock.sendall(START_AGENT)
        except OSError as err:
            raise HostError(host, "spark", f"its Spark task is gone: {err}") from None
        link = SocketLink(host, sock)
        self._links.append(link)
        return link

    def run_module(self, host: str, module: str, *args: str, python: str | None = None,
                   timeout: float = 30.0):
        raise HostError(host, "spark", f"cannot run {module} there: a Spark task has one channel, its agent's",
                        hint="pass network_interface=NIC (the NIC the hosts reach each other by)")

    def sweep(self, host: str, job_id: str, mark_host: str, agent: str | None) -> str | None:
        return ("a Spark task has no second channel; its agent ends its ranks when its channel or its task ends, "
                "and Spark ends the stage's tasks")

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()
        for link in self._links:
            link.sock.close()
        self._links.clear()
