"""Where a job's hosts come from and which fan-out engine reaches them (`--engine ssh|slurm|auto`).

    -H / --hostfile given           those hosts, over SSH (with --engine slurm: through srun, inside the allocation)
    inside a Slurm allocation       the allocation's hosts and slots, through srun (SLURM_JOB_ID set; auto or slurm)
    neither                         this machine, -np slots

The decision and its reason are one value (HostSource) so that --dry-run and --check can say why.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from trainrun.errors import UsageError
from trainrun.plan.hosts import HostSpec

if TYPE_CHECKING:
    from trainrun.cli.config import LaunchConfig
    from trainrun.fanout.base import FanoutEngine
    from trainrun.slurm.allocation import Allocation


@dataclass(frozen=True)
class HostSource:
    hosts: list[HostSpec]
    engine: str                  # "ssh" or "slurm"
    reason: str                  # one line, for --dry-run and --check
    default_np: int | None = None
    allocation: Allocation | None = None  # when the hosts or the engine are Slurm's


def host_source(cfg: LaunchConfig, environ: Mapping[str, str]) -> HostSource:
    """Raises UsageError for --engine slurm outside an allocation, or a malformed Slurm environment."""
    alloc = None
    if cfg.engine != "ssh" and ("SLURM_JOB_ID" in environ or "SLURM_JOBID" in environ):
        from trainrun.slurm.allocation import Allocation

        alloc = Allocation.from_environ(environ)
    if cfg.engine == "slurm" and alloc is None:
        raise UsageError("--engine slurm: not inside a Slurm allocation (no SLURM_JOB_ID); run inside salloc or an "
                         "sbatch script, or submit with trainrun --sbatch")
    if cfg.host_discovery_script:
        return HostSource(cfg.host_specs(), "ssh", "hosts from --host-discovery-script (its list now; it runs again "
                          "every second)", allocation=alloc)
    if cfg.hosts is not None:
        engine = "slurm" if cfg.engine == "slurm" else "ssh"
        flag = "--hostfile" if cfg.hostfile else "-H"
        return HostSource(cfg.host_specs(), engine, f"hosts from {flag}, reached over {engine}", allocation=alloc)
    if alloc is not None:
        hosts = cfg.without_excluded([HostSpec(h.name, h.slots) for h in alloc.hosts])
        why = "--engine slurm" if cfg.engine == "slurm" else "inside a Slurm allocation (SLURM_JOB_ID) with no -H/--hostfile"
        return HostSource(hosts, "slurm", f"{alloc.describe()}; hosts and slots from the allocation, reached through srun "
                          f"({why})", default_np=alloc.default_np, allocation=alloc)
    return HostSource(cfg.host_specs(), "ssh", "no hosts given: this machine")


def engine_for(cfg: LaunchConfig, source: HostSource) -> FanoutEngine:
    """The engine that reaches this job's remote hosts. SSH imports paramiko (only jobs with remote hosts)."""
    python = cfg.python or sys.executable
    if source.engine == "slurm":
        from trainrun.fanout.srun_engine import SrunEngine

        assert source.allocation is not None  # host_source picks the slurm engine only inside an allocation

        return SrunEngine(source.allocation, python, strict_python=cfg.python is not None)
    from trainrun.fanout.ssh_engine import SSHEngine, ssh_options

    return SSHEngine(ssh_options(cfg), python, cfg.ssh_parallelism, strict_python=cfg.python is not None)
