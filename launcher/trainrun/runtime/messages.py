"""The messages ranks exchange about operations, as NamedTuples (picklable, and compared and hashed
as plain tuples, so they cost what tuples cost on the wire and as dict keys).

- `Meta`: one rank's description of an op (Request.meta), what the ranks must agree on. A phase
  gathers them to the coordinator; the response cache numbers them (cache.py).
- `Response`: one entry of the coordinator's answer, run by every rank in the same order
  (negotiation.py lists the kinds and what `info` holds for each).
- `FusionKey`: what allreduces must share to be fused into one reduction (fusion.Fuser).
- `JoinedInfo`: a fused allreduce's key and shapes, sent while some rank has joined, so that a
  rank without the tensors can contribute zeros of the right size.
- `Absent`: an allgather's or broadcast's shape and dtype, sent while some rank that has joined did
  not submit it, so that rank can take part (contributing no rows, or receiving into scratch).
- `OpFailure`: why a response failed its ops (`kind`: "mismatch", "stall" or "abort"; a stall also
  carries the global ranks that did not submit).
"""
from __future__ import annotations

from typing import Any, NamedTuple


class Meta(NamedTuple):
    name: str
    kind: str          # ops.KINDS; for "abort" the name carries the reason
    dtype: str         # logical dtype name (fusion.py)
    shape: tuple       # a group's: the tuple of its members' shapes
    op: int            # ops.Average, Sum, ...
    prescale: float
    postscale: float
    root: int          # broadcast's root within the process set, else -1
    splits: object     # alltoall's send counts, ops.GROUP for a group, else None
    device: str        # "cpu" or "cuda"


class FusionKey(NamedTuple):
    dtype: str
    op: int
    prescale: float
    postscale: float
    device: str


class JoinedInfo(NamedTuple):
    dtype: str
    op: int
    prescale: float
    postscale: float
    device: str
    shapes: list       # one per fused name (a group: its members' shapes)


class Absent(NamedTuple):
    dims: list | None  # allgather: first dimension per rank (0 for a rank that joined); broadcast: None
    shape: tuple
    dtype: str
    root: int          # broadcast: its root; allgather: -1


class OpFailure(NamedTuple):
    kind: str          # "mismatch", "stall" or "abort"
    message: str
    absent: tuple = ()  # "stall": the global ranks that did not submit (the launcher names them)
    seconds: float = 0.0  # "stall": the stall timeout that ran out


class Response(NamedTuple):
    kind: str          # an op kind, "error" or "abort"
    names: list
    info: Any          # per kind (ranks per name, first dims, JoinedInfo, Absent, ...): see negotiation.py
    error: OpFailure | None
