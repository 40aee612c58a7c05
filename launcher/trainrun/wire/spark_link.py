"""The link between a Spark barrier task and the driver that runs a trainrun job on it (sparkrun/, fanout/spark_engine.py).

A task connects to the ONE listening socket the driver opens (on spark.driver.host), and both sides prove
they know the job's secret (32 random bytes, sent to the tasks in the stage's closure) before any other byte
counts; the secret itself never crosses the connection:

    driver -> task   32-byte challenge Cd
    task -> driver   32-byte challenge Ct | HMAC-SHA256(secret, "task" | Cd)
    driver -> task   HMAC-SHA256(secret, "driver" | Ct)        (the task runs what the driver sends: it checks too)
    task -> driver   HELLO: one JSON line (Hello), at most MAX_HELLO bytes
    launcher -> task START_AGENT (one byte): the task runs `python -m trainrun.agent` on this socket (its stdin
                     and stdout; the agent's frames from then on, wire/agent_frames.py); or EOF: no agent is
                     needed on that host (the launcher's own machine), the task just ends

One connection per host: the host's lowest partition makes it; the host's other tasks hold their slots.
After the handshake the driver hands the connected sockets to its launcher child (inherited fds, named
in ENV_LINKS). Pure protocol, stdlib only: both sides import it.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import socket
from typing import NamedTuple

ENV_LINKS = "TRAINRUN_SPARK_LINKS"  # "host=fd,host=fd": the launcher child's inherited task sockets
START_AGENT = b"A"
MAX_HELLO = 4096
CHALLENGE_BYTES = 32


class Hello(NamedTuple):
    """What a host's task says once trusted: its host name, the stage's tasks on that host (its slots), how
    many hosts the stage spans (so the driver knows how many connections to wait for), and the NIC its
    connection left by (the route to the driver: the job's NIC when every host names the same)."""

    host: str
    slots: int
    hosts: int
    nic: str | None


class AuthError(Exception):
    """The peer does not know the secret, or broke the protocol."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise AuthError(f"connection closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def _mac(secret: bytes, who: bytes, challenge: bytes) -> bytes:
    return hmac.new(secret, who + challenge, hashlib.sha256).digest()


def driver_handshake(sock: socket.socket, secret: bytes, nonce: bytes) -> Hello:
    """The driver's side, on an accepted socket (with a timeout set): AuthError unless the peer knows `secret`,
    else its Hello. `nonce`: CHALLENGE_BYTES fresh random bytes."""
    sock.sendall(nonce)
    reply = _recv_exact(sock, 2 * CHALLENGE_BYTES)
    theirs, mac = reply[:CHALLENGE_BYTES], reply[CHALLENGE_BYTES:]
    if not hmac.compare_digest(mac, _mac(secret, b"task", nonce)):
        raise AuthError("the peer does not know the job's secret")
    sock.sendall(_mac(secret, b"driver", theirs))
    line = b""
    while not line.endswith(b"\n"):
        chunk = sock.recv(MAX_HELLO - len(line)) if len(line) < MAX_HELLO else b""
        if not chunk:
            raise AuthError("no hello line")
        line += chunk
    try:
        doc = json.loads(line)
        return Hello(str(doc["host"]), int(doc["slots"]), int(doc["hosts"]), doc.get("nic") and str(doc["nic"]))
    except (ValueError, KeyError, TypeError) as err:
        raise AuthError(f"bad hello: {err}") from None


def task_handshake(sock: socket.socket, secret: bytes, nonce: bytes, hello: Hello) -> None:
    """The task's side, on a connected socket: AuthError unless the driver knows `secret`; then the Hello."""
    theirs = _recv_exact(sock, CHALLENGE_BYTES)
    sock.sendall(nonce + _mac(secret, b"task", theirs))
    if not hmac.compare_digest(_recv_exact(sock, CHALLENGE_BYTES), _mac(secret, b"driver", nonce)):
        raise AuthError("the driver did not prove the job's secret")
    sock.sendall(json.dumps(hello._asdict()).encode() + b"\n")


def format_links(links: dict[str, int]) -> str:
    return ",".join(f"{host}={fd}" for host, fd in links.items())


def parse_links(text: str) -> dict[str, int]:
    """ENV_LINKS' value -> {host: fd}; ValueError on a malformed one."""
    out: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        host, _, fd = item.rpartition("=")
        if not host or not fd.isdigit():
            raise ValueError(f"{ENV_LINKS}: bad entry {item!r} (want HOST=FD)")
        out[host] = int(fd)
    return out
