"""Running what the ranks agreed: each response goes to the collectives of its requests' device.

`open_planes` makes the choice once, when an engine starts (at session start): host memory ->
collectives.MpiCollectives on a backends.mpi.MPIBackend (its own duplicate of the set's
communicator, completing transfers with the TransferWait it is given); CUDA -> backends.nccl.NcclPlane
(an NCCL communicator made on the first CUDA response). Both are backends.Collectives; the
`Dispatch` only looks a plane up by device. It owns the planes and nothing else.
"""
from __future__ import annotations

from operator import attrgetter

from trainrun.runtime.backends import Collectives
from trainrun.runtime.backends.mpi_collectives import MpiCollectives
from trainrun.runtime.meter import Meter
from trainrun.runtime.ops import GROUP, Request


def open_planes(comm, rank: int, size: int, timeline, wait) -> tuple[MpiCollectives, dict[str, Collectives]]:
    """The engine's data planes over `comm` (collective: duplicates it): the host plane and every
    device's plane by Request.device."""
    from trainrun.runtime.backends.mpi import MPIBackend
    from trainrun.runtime.backends.nccl import NcclPlane

    backend = MPIBackend(comm, wait)  # (wait: waiting.TransferWait.wait)
    host = MpiCollectives(backend, rank, size, timeline)
    return host, {"cpu": host, "cuda": NcclPlane(backend.comm, rank, size)}


class Dispatch:
    def __init__(self, host: MpiCollectives, planes: dict[str, Collectives], timeline, meter: Meter):
        """`host`: the CPU plane (its fast paths are called directly); `planes`: by device, host's included;
        `meter`: counts the payload of cached and negotiated allreduces while it is on."""
        self.host = host
        self._planes = planes
        self._timeline = timeline
        self._meter = meter

    def reduce(self, names: list[str], reqs: list[Request]) -> list:
        """One allreduce of `reqs` (every rank has them, no join in effect): results, one per request."""
        req = reqs[0]
        if self._meter.on:
            self._meter.reduced_bytes += _payload(reqs)
        if req.splits == GROUP:
            return [self.host.allreduce_group(req, names, None)]
        if req.device == "cpu":
            if len(reqs) == 1 and self._timeline is None:
                return [self.host.allreduce_one(req)]
            return self.host.allreduce(names, reqs, None)
        return self._planes[req.device].execute("allreduce", names, reqs, None)

    def allreduce_group(self, req: Request | None, names: list[str], info) -> object:
        """A group's one fused reduction with a join in effect (zeros where this rank has joined)."""
        return self.host.allreduce_group(req, names, info)

    def execute(self, kind: str, names: list[str], reqs: list[Request | None], info) -> list:
        """Run a negotiated response on the plane of its requests' device (a joined rank has none:
        the coordinator's info says the device of an allreduce; other kinds run on the host)."""
        some = next((r for r in reqs if r is not None), None)
        device = some.device if some is not None else (info.device if kind == "allreduce" and info else "cpu")
        return self._planes[device].execute(kind, names, reqs, info)

    @property
    def reductions(self) -> int:
        """Allreduce calls made on every plane so far."""
        return sum(p.reductions for p in self._planes.values() if p is not self.host) + self.host.reductions

    def close(self) -> None:
        """Free every plane, device planes first (the NCCL one was made over the host plane's communicator)."""
        for plane in self._planes.values():
            if plane is not self.host:
                plane.close()
        self.host.close()


_NBYTES = attrgetter("nbytes")


def _payload(reqs: list[Request]) -> int:
    """Bytes of the requests' inputs. A group's input is a list of arrays: its fused output has their
    size (one attribute, not one per tensor: a group of 160 small tensors must not pay 160 reads)."""
    n = 0
    for r in reqs:
        if r.splits != GROUP:
            n += r.inp.nbytes
        else:
            n += r.fused.nbytes if r.fused is not None else sum(map(_NBYTES, r.inp))
    return n
