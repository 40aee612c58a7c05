"""Typed payloads of the agent channel's JSON frames (wire.py carries them as bytes).

    HELLO    agent -> launcher   HostFacts (trainrun.facts.model)
    JOB      launcher -> agent   AgentJob: the host's ProcessSpecs and how to run them
    STARTED  agent -> launcher   {rank: pid}
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from trainrun.plan.spec import ProcessSpec, spec_from_dict, spec_to_dict


@dataclass(frozen=True)
class AgentJob:
    """One host's share of the job. `python`: the launcher's interpreter path in the specs' argv (the agent
    swaps in its own); `patience`: seconds of launcher silence before the agent kills its ranks;
    `kvsname`: the MPI world's name, whose /dev/shm segments the agent removes at the end (None: no MPI);
    `elastic`: the job may restart: the agent keeps its ranks' committed state (control channels), and when
    the ranks have ended it cleans up, sends DONE and waits for the next JOB instead of exiting."""

    procs: tuple[ProcessSpec, ...]
    pmi: bool
    python: str
    patience: float
    kvsname: str | None = None
    elastic: bool = False

    def to_bytes(self) -> bytes:
        return json.dumps({"procs": [spec_to_dict(p) for p in self.procs], "pmi": self.pmi, "python": self.python,
                           "patience": self.patience, "kvsname": self.kvsname, "elastic": self.elastic}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> AgentJob:
        d = json.loads(data)
        return cls(tuple(spec_from_dict(p) for p in d["procs"]), d["pmi"], d["python"], d["patience"], d.get("kvsname"),
                   d.get("elastic", False))
