"""The handle table: ints, as in Horovod, for ops started asynchronously by the NumPy and framework
layers. A handle maps to its engine handles (ops.Handle), the engine that runs them, and a
`finalize(results)` that builds what synchronize returns, and the slot an unnamed op holds until it
is synchronized (context.Session.hold). Handles outlive shutdown (synchronizing
one then raises its op's failure). Thread-safe for distinct handles (gradient hooks add them)."""
from __future__ import annotations

import itertools


class Handles:
    def __init__(self, default_engine):
        """`default_engine()`: the engine of an op added without one (the global set's)."""
        # handle -> (engine handles, finalize, engine, slot token or None): a plain tuple, unpacked where read (one is
        # made per async op, and a NamedTuple costs several times more to make)
        self._ops: dict[int, tuple] = {}
        self._ids = itertools.count(1)
        self._default_engine = default_engine

    def add(self, op_handles: list, finalize, eng=None, slot=None) -> int:
        """Register the engine handles of one user-level op, started on engine `eng` (default: the
        global set's); `finalize(results)` builds what synchronize returns; `slot`: the token of the
        name slot it holds (context.Session.hold), released when it is synchronized."""
        h = next(self._ids)
        self._ops[h] = (op_handles, finalize, eng or self._default_engine(), slot)
        return h

    def poll(self, handle: int) -> bool:
        """True when the op behind `handle` has completed (synchronize will not block)."""
        op = self._ops.get(handle)
        if op is None:
            raise ValueError(f"Invalid or already synchronized handle: {handle}")
        return all(h.done for h in op[0])

    def synchronize(self, handle: int):
        """Wait for `handle`, forget it, and return its output; raises its op's error."""
        op = self._ops.pop(handle, None)
        if op is None:
            raise ValueError(f"Invalid or already synchronized handle: {handle}")
        op_handles, finalize, engine, slot = op
        if len(op_handles) == 1:  # one engine handle: the usual case, without the list work below
            (h,) = op_handles
            if not h.done:
                try:
                    engine.wait_all(op_handles)
                finally:
                    if slot is not None:
                        slot[0].used &= ~(1 << slot[1])
            elif slot is not None:
                slot[0].used &= ~(1 << slot[1])
            if h.error is not None:
                raise h.error
            return finalize([h.result])
        self._ops[handle] = op
        return self.synchronize_all([handle])[0]

    def synchronize_all(self, handles: list[int]) -> list:
        """synchronize() of several handles with one wait per engine; forgets them all."""
        try:
            ops = [self._ops.pop(h) for h in handles]
        except KeyError as e:
            raise ValueError(f"Invalid or already synchronized handle: {e.args[0]}") from None
        by_engine: dict = {}  # ops of different process sets: one wait per engine
        for op_handles, _, engine, _ in ops:
            by_engine.setdefault(engine, []).extend(op_handles)
        try:
            for engine, flat in by_engine.items():
                if not all(h.done for h in flat):
                    engine.wait_all(flat)
        finally:
            for op in ops:
                slot = op[3]
                if slot is not None:
                    slot[0].used &= ~(1 << slot[1])
        out = []
        for op_handles, finalize, _, _ in ops:
            for h in op_handles:
                if h.error is not None:
                    raise h.error
            out.append(finalize([h.result for h in op_handles]))
        return out
