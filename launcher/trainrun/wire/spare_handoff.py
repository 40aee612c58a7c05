"""The hand-off to a warm rank: what the owner of a spare process (elasticjob/spares.py) tells it to become.

A spare (elastic/spare.py) is an interpreter started ahead of an elastic job's restart with the rank's
interpreter, working directory and start-up environment, which has imported the framework and waits on a
socketpair. To become a rank it gets one Handoff: the rank's argv, cwd, full environment and CPU set,
and, as SCM_RIGHTS, the descriptors a cold rank would inherit (its PMI socket, diag pipe, control socket).
Descriptors get new numbers in the receiver, so `fd_env` names the variables that carry one (the number
is the part before an optional `:`) and which of the passed descriptors each means; the spare rewrites them.

    spare -> owner   "R"                  ready: the framework is imported (sent once)
    owner -> spare   u32 length | JSON    a Handoff, the descriptors on its first byte

Stdlib only: imported by ranks (the spare) and by the launcher/agent side.
"""
from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass, field

READY = b"R"
# the last variable of a spare's environment: room in its environment block (what /proc/PID/environ shows)
# for the rank's own variables, written there at the hand-off (elastic/spare.py)
PAD_VARIABLE = "TRAINRUN_WARM_PAD"
_LEN = struct.Struct(">I")
MAX_FDS = 8
# the variables a rank's start sets to an inherited descriptor (supervisor/local.py)
FD_VARIABLES = ("PMI_FD", "TRAINRUN_DIAG_FD", "TRAINRUN_CTL_FD")


@dataclass(frozen=True)
class Handoff:
    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    cpus: tuple[int, ...] | None = None  # the CPU set a cold rank would have been bound to (--bind-to core)
    fd_env: dict[str, int] = field(default_factory=dict)  # variable -> index of the passed descriptor

    def to_bytes(self) -> bytes:
        doc = {"argv": list(self.argv), "cwd": self.cwd, "env": self.env,
               "cpus": None if self.cpus is None else list(self.cpus), "fd_env": self.fd_env}
        body = json.dumps(doc, separators=(",", ":")).encode()
        return _LEN.pack(len(body)) + body

    @classmethod
    def from_json(cls, body: bytes) -> Handoff:
        doc = json.loads(body)
        cpus = doc.get("cpus")
        return cls(tuple(doc["argv"]), doc["cwd"], dict(doc["env"]), None if cpus is None else tuple(cpus),
                   {k: int(v) for k, v in doc.get("fd_env", {}).items()})

    def with_fds(self, fds: list[int]) -> dict[str, str]:
        """The environment with each descriptor variable pointing at the receiver's number for it."""
        env = dict(self.env)
        for name, index in self.fd_env.items():
            if name in env and index < len(fds):
                _, sep, rest = env[name].partition(":")
                env[name] = f"{fds[index]}{sep}{rest}"
        return env


def fd_env(env: dict[str, str], pass_fds: tuple[int, ...]) -> dict[str, int]:
    """Which of `pass_fds` each descriptor variable of `env` names (by its number before any `:`). Pure."""
    out = {}
    for name in FD_VARIABLES:
        number = env.get(name, "").partition(":")[0]
        if number.isdigit() and int(number) in pass_fds:
            out[name] = pass_fds.index(int(number))
    return out


def send_handoff(sock: socket.socket, handoff: Handoff, fds: tuple[int, ...]) -> None:
    """Send `handoff` with `fds` (duplicated into the receiver); OSError if the spare is gone."""
    data = handoff.to_bytes()
    sent = socket.send_fds(sock, [data], list(fds))
    if sent < len(data):
        sock.sendall(data[sent:])


def recv_handoff(sock: socket.socket) -> tuple[Handoff, list[int]] | None:
    """The Handoff and the received descriptors; None at EOF (the owner is gone or gave the spare up)."""
    data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, MAX_FDS)
    if not data:
        return None
    while len(data) < _LEN.size:
        more = sock.recv(1 << 16)
        if not more:
            return None
        data += more
    (length,) = _LEN.unpack_from(data)
    body = data[_LEN.size:]
    while len(body) < length:
        more = sock.recv(max(1 << 16, length - len(body)))
        if not more:
            return None
        body += more
    return Handoff.from_json(body[:length]), list(fds)
