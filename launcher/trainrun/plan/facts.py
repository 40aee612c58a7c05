"""Typed host facts: what a host says about itself, as every layer reads it. Pure.

`HostFacts` travels as JSON (the agent's HELLO frame, `python -m trainrun.facts`); `to_json` and
`from_json` are the only places its keys are spelled. The launch set (hostname ... nics) is always
there; the `--check` set (os ... nccl) is filled only by `check_facts()` and is empty otherwise.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ipaddress import IPv4Interface


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi reports it."""

    index: int
    name: str
    memory_mib: int


@dataclass(frozen=True)
class Nic:
    """One network interface of a host. `addresses` are IPv4 interfaces (address + prefix); strings are
    accepted and converted. `speed` is in Mbit/s, 0 when unknown."""

    name: str
    addresses: tuple[IPv4Interface, ...] = ()  # strings are accepted and converted
    up: bool = True
    speed: int = 0
    mtu: int = 1500

    def __post_init__(self) -> None:
        import ipaddress  # here, not at import: a local launch never builds a Nic and skips the import

        object.__setattr__(self, "addresses", tuple(ipaddress.IPv4Interface(a) for a in self.addresses))

    @property
    def usable(self) -> bool:
        """Up, with at least one IPv4 address."""
        return self.up and bool(self.addresses)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "addresses": [str(a) for a in self.addresses], "up": self.up,
                "speed": self.speed, "mtu": self.mtu}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Nic:
        return cls(d["name"], tuple(d["addresses"]), d["up"], d["speed"], d["mtu"])


@dataclass(frozen=True)
class HostFacts:
    """One host's facts. GPU ids in `gpus` are the host's own (see facts/gpus.py)."""

    hostname: str
    cpus: int
    python: str                      # the interpreter that gathered them (the agent's, on a remote host)
    trainrun: str                    # trainrun's version there
    gpus: tuple[int, ...] = ()
    free_port: int = 29500           # a TCP port free there when asked (MASTER_PORT for rank 0's host)
    worker_ports: tuple[int, ...] = ()  # more ports free there then (TF_CONFIG's workers, one per local rank)
    nics: tuple[Nic, ...] = ()
    shm_free: int | None = None      # bytes free in /dev/shm when asked (None: unknown, an older agent): the MPI world's room
    # --check only
    os: str = ""
    distro: str = ""
    python_version: str = ""
    gpu_models: tuple[str, ...] = ()
    gpu_memory_mib: tuple[int, ...] = ()  # each GPU's memory, as nvidia-smi reports it
    mpi4py: str | None = None
    mpi: str | None = None           # MPI library version line, None when none is usable
    vendor: str | None = None
    mpi_error: str = ""              # why `mpi` is None
    # --check only, the sameness table of `--check --perf` (None: not installed there)
    numpy: str | None = None
    torch: str | None = None
    tensorflow: str | None = None
    cuda_driver: str | None = None   # nvidia-smi's driver version, None without GPUs
    nccl: str | None = None          # the NCCL wheel's version (nvidia-nccl-cu*), None when absent

    def nic(self, name: str) -> Nic | None:
        return next((n for n in self.nics if n.name == name), None)

    def address_on(self, nic_name: str) -> str | None:
        """This host's first IPv4 address on `nic_name`, or None."""
        nic = self.nic(nic_name)
        return str(nic.addresses[0].ip) if nic is not None and nic.addresses else None

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["nics"] = [n.to_json() for n in self.nics]
        doc["gpus"], doc["gpu_models"] = list(self.gpus), list(self.gpu_models)
        doc["gpu_memory_mib"] = list(self.gpu_memory_mib)
        doc["worker_ports"] = list(self.worker_ports)
        return doc

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HostFacts:
        """Unknown keys are ignored (a newer trainrun's extra facts); missing ones take their defaults."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["nics"] = tuple(Nic.from_json(n) for n in d.get("nics", ()))
        kw["gpus"] = tuple(d.get("gpus", ()))
        kw["worker_ports"] = tuple(d.get("worker_ports", ()))
        kw["gpu_models"] = tuple(d.get("gpu_models", ()))
        kw["gpu_memory_mib"] = tuple(d.get("gpu_memory_mib", ()))
        return cls(**kw)


NO_FACTS = HostFacts(hostname="", cpus=0, python="", trainrun="")  # a host not asked (a dry run's remote host)
