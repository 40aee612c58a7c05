"""The coordinator (rank 0's engine): which named operations are ready on every rank, in one order.

Pure bookkeeping, no MPI: ranks `submit` the metas of their new requests (messages.Meta); the
engine asks `responses()` for the work every rank must now run, in the same order everywhere. A
response is a messages.Response `(kind, names, info, error)`:

    ("allreduce", [names...], joined_info, None)   one fused reduction (fusion.Fuser's rule); while
                                                   some rank has joined, joined_info is a JoinedInfo
                                                   (key and shapes) so it can add zeros; else None.
                                                   A group (ops.GROUP) is one name, never fused with
                                                   others; its shapes are the members'.
    ("allgather", [name], first_dims_per_rank, None)   while ranks that joined lack it: an Absent
                                                   (dims, shape, dtype), their dims 0
    ("broadcast", [name], Absent(None, shape, dtype, root), None)  while ranks that joined lack it
    ("alltoall",  [name], splits_per_rank, None)
    ("broadcast"|"reducescatter"|"barrier"|"shutdown", [name], None, None)
    ("join", ["__join__"], last_rank_to_join, None)
    ("abort", [], None, OpFailure("abort", message)) a rank stopped for good (see Engine.abort): every
                                                   rank fails all it has outstanding and closes
    ("error", [names...], submitters, OpFailure("mismatch"|"stall"|"left", message))
                                                   submitters[i]: the ranks that had submitted names[i];
                                                   only their requests fail (a later submission of the
                                                   same name by another rank is a new operation)

A name is ready when every rank has submitted it (a rank blocked in join() counts: it adds zeros to
an allreduce, no rows to an allgather, and receives a broadcast it cannot be the root of; other
kinds fail while ranks have joined).
Names that some but not all ranks submitted for longer than `stall_timeout` seconds become a stall error.

A rank that submitted `shutdown` has *left* (its program ended, or called shutdown()): it will submit
nothing else, so every other name it lacks fails at once on the ranks that wait for it ("left": the
message is "trainrun: rank N stopped: it left (...) while rank M waited in allreduce 'x'", the form the
launcher reads to name the cause, supervisor/result.py), as Horovod fails ops issued after a rank finished.
Shutdown itself never stalls: a rank that finished waits there, taking part in rounds, for as long
as the others still work (ranks finish at different times), so their later collectives fail at once.
"""
from __future__ import annotations

import time

from trainrun.rankset import describe_ranks
from trainrun.runtime.fusion import Batch, Fuser, fusion_of
from trainrun.runtime.messages import Absent, OpFailure, JoinedInfo, Meta, Response
from trainrun.runtime.ops import OP_NAMES

JOIN_NAME, SHUTDOWN_NAME = "__join__", "__shutdown__"


def _ranks(rs) -> str:
    rs = sorted(rs)
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {rs}"


def _differs(name: str, entry: dict, label: str, value) -> str | None:
    by_value: dict = {}
    for r, m in sorted(entry.items()):
        by_value.setdefault(value(m), []).append(r)
    if len(by_value) < 2:
        return None
    parts = "; ".join(f"{_ranks(rs)}: {v}" for v, rs in by_value.items())
    return f"Mismatched {label} for tensor '{name}': {parts}"


def check(name: str, entry: dict[int, Meta]) -> str | None:
    """The first disagreement between the ranks' metas for `name`, as a message, or None."""
    metas = iter(entry.values())
    first = next(metas)
    if all(m == first for m in metas):
        return None
    checks = [("operation", lambda m: m.kind), ("dtype", lambda m: m.dtype), ("device", lambda m: m.device)]
    kind = first.kind
    if kind in ("allreduce", "reducescatter"):
        checks += [("reduce op", lambda m: OP_NAMES.get(m.op, m.op)),
                   ("prescale_factor", lambda m: m.prescale), ("postscale_factor", lambda m: m.postscale)]
    if kind in ("allreduce", "broadcast", "reducescatter"):
        checks.append(("shape", lambda m: tuple(m.shape)))
    if kind in ("allgather", "alltoall"):
        checks.append(("shape beyond the first dimension", lambda m: tuple(m.shape[1:])))
    if kind == "broadcast":
        checks.append(("root_rank", lambda m: m.root))
    for label, value in checks:
        msg = _differs(name, entry, label, value)
        if msg:
            return msg
    return None


class Coordinator:
    """Matches submissions from `size` ranks. Not thread-safe: only the engine's driver calls it."""

    def __init__(self, size: int, fusion_threshold: int, stall_timeout: float, clock=time.monotonic,
                 ranks: list[int] | None = None):
        """`ranks`: the global ranks of the set's members (a stall names them; default: 0..size-1)."""
        self.size, self.fusion_threshold, self.stall_timeout, self._clock = size, fusion_threshold, stall_timeout, clock
        self._global = list(range(size)) if ranks is None else list(ranks)
        self._table: dict[str, dict[int, Meta]] = {}  # name -> its metas by the ranks that submitted it
        self._first: dict[str, float] = {}
        self._ready: list[str] = []
        self._joined: list[int] = []
        self._next_stall_check = 0.0
        self._aborted: str | None = None
        self._left: list[int] = []  # ranks that submitted shutdown, in that order

    def pending(self) -> bool:
        return bool(self._table or self._joined or self._aborted)

    def stall_check_due(self) -> bool:
        """Some name waits on some ranks and the next stall check is due."""
        return bool(self._first) and self._clock() >= self._next_stall_check

    def submit(self, rank: int, metas) -> None:
        now = None
        for m in metas:
            if m.kind == "abort":  # the name carries the reason
                self._aborted = f"rank {rank} stopped: {m.name}"
                continue
            if m.kind == "join":
                self._joined.append(rank)
                self._ready.extend(n for n, e in self._table.items() if n not in self._ready and self._complete(e))
                continue
            if m.kind == "shutdown":
                self._left.append(rank)
            entry = self._table.get(m.name)
            if entry is None:
                entry = self._table[m.name] = {}
                if m.kind != "shutdown":  # (never a stall: see the module docstring)
                    self._first[m.name] = now = now or self._clock()
            entry[rank] = m
            if (len(entry) >= self.size) if not self._joined else self._complete(entry):
                self._ready.append(m.name)

    def _complete(self, entry: dict) -> bool:
        if not self._joined:
            return len(entry) >= self.size
        return len(entry) + sum(1 for r in self._joined if r not in entry) >= self.size

    def responses(self) -> list[Response]:
        """Everything now runnable, fused, in the order all ranks must run it; plus stall errors."""
        if self._aborted:
            self._table.clear()
            self._first.clear()
            self._ready.clear()
            self._joined.clear()
            return [Response("abort", [], None, OpFailure("abort", self._aborted))]
        if len(self._ready) == 1 and not self._joined:  # one lone op, the common case: short path
            name = self._ready[0]
            entry = self._table[name]
            metas = iter(entry.values())
            first = next(metas)
            if first.kind == "allreduce" and all(m == first for m in metas):
                del self._table[name], self._first[name]
                self._ready.clear()
                one = [Response("allreduce", [name], None, None)]
                if self._first:
                    one.extend(self._left_behind())
                    one.extend(self._stalls())
                return one
        out: list[Response] = []
        fuser = Fuser(self.fusion_threshold)  # items: metas
        for name in self._ready:
            entry = self._table.pop(name)
            self._first.pop(name, None)  # (shutdown has none)
            any_meta = next(iter(entry.values()))
            kind = any_meta.kind
            error = check(name, entry)
            absent = len(entry) < self.size  # (only while ranks have joined)
            if error is None and absent and kind not in ("allreduce", "allgather", "broadcast"):
                error = (f"Tensor '{name}' is a {kind} but {_ranks(set(self._joined))} already called join(); "
                         "only allreduce, allgather and broadcast can run while ranks have joined")
            if error is None and absent and kind == "broadcast" and any_meta.root not in entry:
                error = (f"Tensor '{name}' is a broadcast from root_rank {any_meta.root}, which already called "
                         "join(): a rank that has joined cannot be a broadcast root")
            if error:
                out.append(Response("error", [name], [set(entry)], OpFailure("mismatch", error)))
            elif kind == "allreduce":
                closed = fuser.add(any_meta, *fusion_of(any_meta))
                if closed is not None:
                    out.append(self._allreduce_response(closed))
            elif kind == "allgather":
                dims = [entry[r].shape[0] if r in entry else 0 for r in range(self.size)]  # joined: no rows
                info = Absent(dims, any_meta.shape, any_meta.dtype, -1) if absent else dims
                out.append(Response(kind, [name], info, None))
            elif kind == "broadcast" and absent:
                out.append(Response(kind, [name], Absent(None, any_meta.shape, any_meta.dtype, any_meta.root), None))
            elif kind == "alltoall":
                out.append(Response(kind, [name], [entry[r].splits for r in range(self.size)], None))
            else:
                out.append(Response(kind, [name], None, None))
        self._ready.clear()
        for batch in fuser.rest():
            out.append(self._allreduce_response(batch))
        if len(set(self._joined)) >= self.size and not self._table:
            out.append(Response("join", [JOIN_NAME], self._joined[-1], None))
            self._joined.clear()
        out.extend(self._left_behind())
        out.extend(self._stalls())
        return out

    def _allreduce_response(self, batch: Batch) -> Response:
        metas = batch.items
        joined = None
        if self._joined:  # what a rank without the tensors needs to add zeros
            if batch.key is None:  # a group: its members' shapes
                m = metas[0]
                joined = JoinedInfo(m.dtype, m.op, m.prescale, m.postscale, m.device, list(m.shape))
            else:
                joined = JoinedInfo(*batch.key, [m.shape for m in metas])
        return Response("allreduce", [m.name for m in metas], joined, None)

    def _left_behind(self) -> list[Response]:
        """Errors for the names that lack a rank which has left (submitted shutdown): they can never
        complete. One response per set of such ranks, naming the first of them (the cause)."""
        if not self._left or not self._first:
            return []
        by_missing: dict[tuple, list[str]] = {}
        for name in self._first:
            entry = self._table[name]
            missing = tuple(r for r in self._left if r not in entry)
            if missing:
                by_missing.setdefault(missing, []).append(name)
        out = []
        for missing, names in by_missing.items():
            entries = [self._table.pop(n) for n in names]
            for n in names:
                del self._first[n]
            waiting = set().union(*entries)
            ops = ", ".join(f"{next(iter(e.values())).kind} '{n}'" for n, e in zip(names[:10], entries))
            if len(names) > 10:
                ops += f" and {len(names) - 10} more"
            also = f" ({describe_ranks(missing[1:])} left too)" if len(missing) > 1 else ""
            out.append(Response("error", names, [set(e) for e in entries], OpFailure("left", (
                f"trainrun: rank {missing[0]} stopped: it left (its program ended or called hvd.shutdown) "
                f"while {describe_ranks(waiting)} waited in {ops}{also}; collectives cannot complete without it"))))
        return out

    def _stalls(self) -> list[Response]:
        now = self._clock()
        if now < self._next_stall_check or not self._first:
            return []
        self._next_stall_check = now + min(1.0, self.stall_timeout / 4)
        by_missing: dict[tuple, list[str]] = {}
        for name, since in self._first.items():
            if now - since > self.stall_timeout:
                present = set(self._table[name]) | set(self._joined)
                missing = tuple(r for r in range(self.size) if r not in present)
                by_missing.setdefault(missing, []).append(name)
        out = []
        for missing, names in by_missing.items():
            submitters = [set(self._table.pop(n)) for n in names]
            for n in names:
                del self._first[n]
            shown = ", ".join(f"'{n}'" for n in names[:10])
            if len(names) > 10:
                shown += f" and {len(names) - 10} more"
            absent = tuple(self._global[r] for r in missing)
            out.append(Response("error", names, submitters, OpFailure("stall", (
                f"Stalled for more than {self.stall_timeout:g} s: {_ranks(absent)} did not submit {shown}, "
                f"which the other ranks are waiting on (a rank stopped participating, or ranks issue "
                f"different collectives; TRAINRUN_STALL_TIMEOUT sets the limit)"), absent, self.stall_timeout)))
        return out
