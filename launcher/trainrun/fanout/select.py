"""Where a job's hosts come from and which fan-out engine reaches them (`--engine ssh|slurm|auto`).

    -H / --hostfile given           those hosts, over SSH (with --engine slurm: through srun, inside the allocation)
    inside a Slurm allocation       the allocation's hosts and slots, through srun (SLURM_JOB_ID set; auto or slurm)
    --ray [ADDRESS]                 the nodes where Ray placed one bundle per rank, through actors there (ray_engine.py)
    neither                         this machine, -np slots

The decision and its reason are one value (HostSource) so that --dry-run and --check can say why. Its input
(HostRequest) holds the hosts as the user gave them, already read (a hostfile) or run (a discovery script's
first answer): the launch step (launchspec.resolve) makes both once, and every mode takes the HostSource.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Mapping, NamedTuple, TYPE_CHECKING

from trainrun.errors import UsageError
from trainrun.plan.hosts import Exclusion, HostSpec, apply_exclude

if TYPE_CHECKING:
    from trainrun.fanout.base import FanoutEngine
    from trainrun.fanout.ray_engine import RayEngine, RayRequest
    from trainrun.slurm.allocation import Allocation


class HostRequest(NamedTuple):  # (not a dataclass: see plan/planner.py's note)
    """Where the user said the hosts are: `given` (-H's, --hostfile's or --host-discovery-script's first answer;
    None: none given), `flag` (which of those, for the reason line), `engine` (--engine: auto, ssh, slurm),
    `exclude` (--exclude), `local_np` (-np, else --tf-cluster's task count: this machine's slots when no host
    is given), `ray` (--ray: the placement to ask Ray for; the hosts are then Ray's)."""

    given: tuple[HostSpec, ...] | None = None
    flag: str | None = None
    engine: str = "auto"
    exclude: Exclusion = Exclusion()
    local_np: int | None = None
    ray: RayRequest | None = None


class ReachOptions(NamedTuple):  # (not a dataclass: see plan/planner.py's note)
    """How remote hosts are reached: the SSH options (None: the ssh config's, then OpenSSH's defaults),
    --ssh-parallelism, and --python (None: the launcher's path where it exists, else python3)."""

    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    ssh_config: str | None = None
    ssh_strict: bool = False
    ssh_timeout: float = 15.0
    ssh_parallelism: int = 64
    python: str | None = None

    @property
    def cache_key(self) -> tuple[str, ...]:
        """What tells two ways of reaching the same host names apart (net/choice.py's NIC cache key)."""
        return str(self.ssh_config), str(self.ssh_port), str(self.ssh_identity_file)


@dataclass(frozen=True)
class HostSource:
    """Where the job's hosts come from, the engine that reaches them and why (host_source's answer)."""

    hosts: list[HostSpec]
    engine: str                  # "ssh", "slurm", "spark" or "ray"
    reason: str                  # one line, for --dry-run and --check
    default_np: int | None = None
    allocation: Allocation | None = None  # when the hosts or the engine are Slurm's
    ray: RayEngine | None = None  # --ray: the engine that placed the hosts (it holds their placement group)


def host_source(req: HostRequest, environ: Mapping[str, str]) -> HostSource:
    """Raises UsageError for --engine slurm outside an allocation, a malformed Slurm environment, no host and
    no -np, or an --exclude that names no host of the job or leaves none."""
    if req.given is not None and environ.get("TRAINRUN_SPARK_LINKS"):  # launched by sparkrun/driver.py
        return HostSource(list(req.given), "spark", "hosts from the Spark stage's barrier tasks, reached over the "
                          "sockets they opened to the driver")
    if req.ray is not None:
        from trainrun.fanout.ray_engine import RayEngine

        ray = RayEngine(req.ray, environ)
        hosts = ray.place()
        return HostSource(hosts, "ray", f"--ray {ray.address}: {req.ray.np} bundle(s) placed by Ray "
                          f"({req.ray.strategy}) on {len(hosts)} node(s), reached through a Ray actor on each",
                          ray=ray)
    alloc = None
    if req.engine != "ssh" and ("SLURM_JOB_ID" in environ or "SLURM_JOBID" in environ):
        from trainrun.slurm.allocation import Allocation

        alloc = Allocation.from_environ(environ)
    if req.engine == "slurm" and alloc is None:
        raise UsageError("--engine slurm: not inside a Slurm allocation (no SLURM_JOB_ID); run inside salloc or an "
                         "sbatch script, or submit with trainrun --sbatch")
    if req.given is not None and req.flag == "--host-discovery-script":
        return HostSource(_kept(list(req.given), req.exclude), "ssh", "hosts from --host-discovery-script (its "
                          "list now; it runs again every second)", allocation=alloc)
    if req.given is not None:
        engine = "slurm" if req.engine == "slurm" else "ssh"
        return HostSource(_kept(list(req.given), req.exclude), engine, f"hosts from {req.flag}, reached over {engine}",
                          allocation=alloc)
    if alloc is not None:
        hosts = _kept([HostSpec(h.name, h.slots) for h in alloc.hosts], req.exclude)
        why = "--engine slurm" if req.engine == "slurm" else "inside a Slurm allocation (SLURM_JOB_ID) with no -H/--hostfile"
        return HostSource(hosts, "slurm", f"{alloc.describe()}; hosts and slots from the allocation, reached through srun "
                          f"({why})", default_np=alloc.default_np, allocation=alloc)
    if req.local_np is None:
        raise UsageError("-np is required when no hosts are given (-np N alone runs N ranks on this machine)")
    return HostSource(_kept([HostSpec("localhost", req.local_np)], req.exclude), "ssh", "no hosts given: this machine")


def _kept(specs: list[HostSpec], exclude: Exclusion) -> list[HostSpec]:
    """`specs` less the hosts --exclude names: every mode's hosts come through here."""
    return apply_exclude(specs, exclude) if exclude else specs


def engine_for(reach: ReachOptions, source: HostSource) -> FanoutEngine:
    """The engine that reaches this job's remote hosts. SSH imports paramiko (only jobs with remote hosts)."""
    python = reach.python or sys.executable
    if source.ray is not None:
        source.ray.python, source.ray.strict_python = python, reach.python is not None
        return source.ray
    if source.engine == "spark":
        import os

        from trainrun.fanout.spark_engine import SparkEngine

        return SparkEngine.from_environ(os.environ)
    if source.engine == "slurm":
        from trainrun.fanout.srun_engine import SrunEngine

        assert source.allocation is not None  # host_source picks the slurm engine only inside an allocation

        return SrunEngine(source.allocation, python, strict_python=reach.python is not None)
    from trainrun.fanout.ssh import SSHOptions
    from trainrun.fanout.ssh_engine import SSHEngine

    # None fields fall back to the ssh config, then OpenSSH's defaults (SSHOptions' own default config path)
    opts = SSHOptions(port=reach.ssh_port, identity_file=reach.ssh_identity_file, strict=reach.ssh_strict,
                      connect_timeout=reach.ssh_timeout)
    return SSHEngine(replace(opts, ssh_config=reach.ssh_config) if reach.ssh_config else opts, python,
                     reach.ssh_parallelism, strict_python=reach.python is not None)
