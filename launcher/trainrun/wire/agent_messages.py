"""Typed payloads of the agent channel's JSON frames (agent_frames.py carries them as bytes).

    HELLO    agent -> launcher   HostFacts (trainrun.plan.facts)
    JOB      launcher -> agent   AgentJob: the host's ProcessSpecs and how to run them
    STARTED  agent -> launcher   {rank: pid}
    BEAT     both ways           Beat: the sender's wall clock (and the echo of the peer's)
    EXIT     agent -> launcher   ExitReport: a rank's returncode, when (agent's clock), OOM verdict
    DUMP     launcher -> agent   DumpRequest          STACKS   agent -> launcher   DumpReply
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from trainrun.diag.stacks import RankStack
from trainrun.plan.spec import ProcessSpec, spec_from_dict, spec_to_dict


@dataclass(frozen=True)
class AgentJob:
    """One host's share of the job. `python`: the launcher's interpreter path in the specs' argv (the agent
    swaps in its own); `patience`: seconds of launcher silence before the agent kills its ranks;
    `kvsname`: the MPI world's name, whose /dev/shm segments the agent removes at the end (None: no MPI);
    `elastic`: the job may restart: the agent keeps its ranks' committed state (control channels), and when
    the ranks have ended it cleans up, sends DONE and waits for the next JOB instead of exiting;
    `restartable`: a parameter-server job: a rank that ended may be started again (RESTART), so the agent
    stays until the launcher closes the channel; `warm`: an elastic job's agent keeps a spare interpreter per
    rank for the next attempt (elasticjob/spares.py, --warm-ranks)."""

    procs: tuple[ProcessSpec, ...]
    pmi: bool
    python: str
    patience: float
    kvsname: str | None = None
    elastic: bool = False
    restartable: bool = False
    warm: bool = False

    def to_bytes(self) -> bytes:
        return json.dumps({"procs": [spec_to_dict(p) for p in self.procs], "pmi": self.pmi, "python": self.python,
                           "patience": self.patience, "kvsname": self.kvsname, "elastic": self.elastic,
                           "restartable": self.restartable, "warm": self.warm}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> AgentJob:
        d = json.loads(data)
        return cls(tuple(spec_from_dict(p) for p in d["procs"]), d["pmi"], d["python"], d["patience"], d.get("kvsname"),
                   d.get("elastic", False), d.get("restartable", False), d.get("warm", False))


@dataclass(frozen=True)
class Beat:
    """`t`: the sender's time.time() when sent; `echo`: the launcher's `t` this beat answers (agent only)."""

    t: float
    echo: float | None = None

    def to_bytes(self) -> bytes:
        return json.dumps({"t": self.t, "echo": self.echo}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Beat | None:
        """None for an empty payload (a peer that sends bare beats)."""
        if not data:
            return None
        d = json.loads(data)
        return cls(d["t"], d.get("echo"))


@dataclass(frozen=True)
class ExitReport:
    """`at`: time.time() on the agent's host when the rank was reaped (None from an agent of an older
    trainrun, whose EXIT payload is the bare return code); `oom`: supervisor/oom.py's verdict."""

    returncode: int
    at: float | None
    oom: str | None = None

    def to_bytes(self) -> bytes:
        return json.dumps({"rc": self.returncode, "at": self.at, "oom": self.oom}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ExitReport:
        d = json.loads(data)
        if isinstance(d, int):
            return cls(d, None)
        return cls(d["rc"], d["at"], d.get("oom"))


@dataclass(frozen=True)
class DumpRequest:
    """Take the stacks of the running ranks; `py_spy`: try py-spy first (else only the faulthandler)."""

    request: int
    py_spy: bool = True

    def to_bytes(self) -> bytes:
        return json.dumps({"request": self.request, "py_spy": self.py_spy}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> DumpRequest:
        d = json.loads(data)
        return cls(d["request"], d["py_spy"])


@dataclass(frozen=True)
class DumpReply:
    request: int
    stacks: tuple[RankStack, ...]

    def to_bytes(self) -> bytes:
        return json.dumps({"request": self.request, "stacks": [s.to_dict() for s in self.stacks]}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> DumpReply:
        d = json.loads(data)
        return cls(d["request"], tuple(RankStack.from_dict(s) for s in d["stacks"]))
