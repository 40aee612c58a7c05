"""The engine's Dispatch (runtime/dispatch.py): a response goes to the plane of its requests' device, as
chosen when the engine was made; reductions count every plane's; closing frees device planes before the
host plane (NCCL's communicator was made over the host plane's). Fake planes: this is routing logic only
(the real MPI plane runs in tests/runtime, the NCCL one on a GPU machine: tests/runtime/test_gpu.py)."""
from __future__ import annotations

import numpy as np

from trainrun.runtime.backends import Collectives
from trainrun.runtime.dispatch import Dispatch
from trainrun.runtime.meter import Meter
from trainrun.runtime.messages import JoinedInfo
from trainrun.runtime.ops import Request, Sum


class FakePlane:
    def __init__(self, name: str, log: list):
        self.name, self.log, self.reductions = name, log, 0

    def execute(self, kind, names, reqs, info) -> list:
        self.log.append((self.name, kind, tuple(names)))
        self.reductions += kind == "allreduce"
        return [self.name for _ in reqs]

    def close(self) -> None:
        self.log.append((self.name, "close", ()))

    # the host plane's fast paths
    def allreduce_one(self, req):
        self.log.append((self.name, "one", (req.name,)))
        self.reductions += 1
        return req.out


def make(meter=None):
    log: list = []
    host, gpu = FakePlane("mpi", log), FakePlane("nccl", log)
    planes: dict[str, Collectives] = {"cpu": host, "cuda": gpu}
    return Dispatch(host, planes, None, meter or Meter(on=False)), log  # type: ignore[arg-type]


def req(name, device="cpu"):
    a = np.ones(4, np.float32)
    return Request("allreduce", name, a, a, (4,), "float32", Sum, device=device)


def test_a_response_runs_on_its_device_s_plane():
    dispatch, log = make()
    dispatch.reduce(["c"], [req("c")])
    dispatch.reduce(["g"], [req("g", "cuda")])
    dispatch.execute("broadcast", ["b"], [req("b", "cuda")], None)
    dispatch.execute("allgather", ["a"], [req("a")], [1, 1])
    assert log == [("mpi", "one", ("c",)), ("nccl", "allreduce", ("g",)), ("nccl", "broadcast", ("b",)),
                   ("mpi", "allgather", ("a",))]
    assert dispatch.reductions == 2  # one per plane


def test_a_joined_rank_follows_the_device_the_coordinator_names():
    dispatch, log = make()
    info = JoinedInfo("float32", Sum, 1.0, 1.0, "cuda", [(4,)])
    dispatch.execute("allreduce", ["g"], [None], info)
    assert log == [("nccl", "allreduce", ("g",))]


def test_close_frees_device_planes_first():
    dispatch, log = make()
    dispatch.close()
    assert log == [("nccl", "close", ()), ("mpi", "close", ())]


def test_the_payload_counts_while_the_meter_is_on():
    meter = Meter(on=True)
    dispatch, _ = make(meter)
    dispatch.reduce(["c"], [req("c")])
    meter.on = False
    dispatch.reduce(["d"], [req("d")])
    assert meter.reduced_bytes == 16
