"""The response cache: signatures (Request.meta) of allreduces that ran, numbered in the order they ran.

Every rank runs the same responses in the same order, so every rank numbers them alike without
sending anything. From then on an op with a known signature is agreed by its number's bit in a
round (rounds.py) instead of being announced to the coordinator, and the ranks fuse such ops by
themselves (`batches`), from the signatures alone, so again alike everywhere. Pure bookkeeping.
"""
from __future__ import annotations

import math

from trainrun.runtime import rounds
from trainrun.runtime.fusion import wire_dtype
from trainrun.runtime.ops import GROUP

CAPACITY = 4096  # signatures remembered (Horovod's default is 1024); later ones are always announced


class ResponseCache:
    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self.ids: dict[tuple, int] = {}   # meta -> id (engine hot paths read it directly)
        self.metas: list[tuple] = []      # id -> meta
        self._fusion: list[tuple] = []    # id -> (fusion key, or None for a group; bytes on the wire)
        self._solo: dict[int, bytes] = {}
        self._plans: dict[tuple, list] = {}  # (agreed mask, threshold) -> batches (a training step agrees
        self.words = rounds.words(0)         # the same set of ops every time); a round's size in words

    def add(self, reqs) -> None:
        """Number the signatures of these allreduce requests (they just ran, no join in effect)."""
        for r in reqs:
            if r.cid is None and len(self.metas) < self.capacity:
                m = r.meta()
                if m not in self.ids:
                    self.ids[m] = len(self.metas)
                    self.metas.append(m)
                    self._fusion.append((None, 0) if r.splits == GROUP else (
                        (r.dtype, r.op, r.prescale, r.postscale, r.device),
                        math.prod(r.shape) * wire_dtype(r.dtype).itemsize))
        self.words = rounds.words(len(self.metas))

    def solo(self, cid: int) -> bytes:
        """A round's contribution of op `cid` alone, no flags (what the lone-op shortcuts send)."""
        send = self._solo.get(cid)
        if send is None or len(send) != 16 * self.words:
            send = self._solo[cid] = rounds.encode(0, 1 << cid, self.words)
        return send

    def plan(self, mask: int, threshold: int) -> list[list[int]]:
        """`batches` of the ids in `mask`, remembered (a few hundred distinct masks at most)."""
        key = (mask, threshold)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= 256:
                self._plans.clear()
            plan = self._plans[key] = self.batches(rounds.ids(mask), threshold)
        return plan

    def batches(self, cids: list[int], threshold: int) -> list[list[int]]:
        """The reductions that run `cids` (ascending), in order: a group alone; other ops fused by
        dtype/op/scales/device while the fused buffer stays within `threshold` bytes."""
        out: list[list[int]] = []
        open_: dict[tuple, list] = {}  # fusion key -> [ids, bytes]
        for c in cids:
            key, nbytes = self._fusion[c]
            if key is None:
                out.append([c])
                continue
            batch = open_.get(key)
            if batch is not None and batch[1] + nbytes > threshold:
                out.append(batch[0])
                batch = None
            if batch is None:
                batch = open_[key] = [[], 0]
            batch[0].append(c)
            batch[1] += nbytes
        out.extend(batch for batch, _ in open_.values())
        return out
