"""The response cache: signatures (Request.meta) of allreduces that ran, numbered in the order they ran.

Every rank runs the same responses in the same order, so every rank numbers them alike without
sending anything. From then on an op with a known signature is agreed by its number's bit in a
round (rounds.py) instead of being announced to the coordinator, and the ranks fuse such ops by
themselves (`batches`, fusion.Fuser's rule), from the signatures alone, so again alike everywhere.
Pure bookkeeping.
"""
from __future__ import annotations

from trainrun.runtime import rounds
from trainrun.runtime.fusion import Fuser, fusion_of
from trainrun.runtime.messages import FusionKey, Meta

CAPACITY = 4096  # signatures remembered (Horovod's default is 1024); later ones are always announced


class ResponseCache:
    """Signatures by id and ids by signature; only the engine's driver uses it."""

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self.ids: dict[Meta, int] = {}    # meta -> id (engine hot paths read it directly)
        self.metas: list[Meta] = []       # id -> meta
        # id -> (id, fusion key's number or None for a group, bytes): fusion.fusion_of(its meta), with
        # each FusionKey replaced by a small int (hashing those is what planning a step costs)
        self._fusion: list[tuple[int, int | None, int]] = []
        self._keys: dict[FusionKey, int] = {}
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
                    key, nbytes = fusion_of(m)
                    key_id = None if key is None else self._keys.setdefault(key, len(self._keys))
                    self._fusion.append((self.ids[m], key_id, nbytes))
        self.words = rounds.words(len(self.metas))

    def solo(self, cid: int) -> bytes:
        """A round's contribution of op `cid` alone, no flags (what the lone-op path sends)."""
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
        """The reductions that run `cids` (ascending), in order (fusion.Fuser)."""
        fuser = Fuser(threshold)
        fusion = self._fusion
        out = [batch.items for batch in fuser.add_all([fusion[c] for c in cids])]
        out.extend(batch.items for batch in fuser.rest())
        return out
