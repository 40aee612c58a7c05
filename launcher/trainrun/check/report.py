"""`trainrun --check`: can this job run? Per host: reachability and facts; across hosts: NICs; then the plan.

Pure: `evaluate`, `render_report` and `report_json` turn collected results (collect.py) into problems,
a verdict and tables. A report is OK only when the job could
run as asked: every host reached and set up (its Python found, the ranks' working directory there), enough GPUs for the local ranks (or sharing allowed),
one MPI across hosts, and, with several hosts, at least one NIC routable between all of them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainrun.version import __version__
from trainrun.plan.facts import NO_FACTS, HostFacts
from trainrun.table import render_table

if TYPE_CHECKING:
    from trainrun.check.perf_verdict import PerfResult


@dataclass(frozen=True)
class HostCheck:
    host: str
    slots: int
    stage: str | None = None  # the stage that failed (dns, tcp, ssh, hostkey, auth, python, facts, workdir), None if OK
    error: str = ""
    facts: HostFacts = NO_FACTS
    via: str = "remote"  # or "local": this machine, no fan-out

    @property
    def ok(self) -> bool:
        return self.stage is None


@dataclass(frozen=True)
class CheckReport:
    hosts: list[HostCheck]
    nics: list[str]                 # NICs routable between all hosts (chosen for the job)
    nic_rows: list[tuple]           # (host, nic, addresses, up, speed, verdict) for the NIC table
    ranks: list                     # RankAssignment list, or [] if the plan could not be made
    problems: list[str]
    warnings: list[str] = field(default_factory=list)
    np: int = 0                     # ranks asked for
    source: str = ""                # where the hosts came from and how they are reached (fanout/select.py)
    perf: PerfResult | None = None  # with --perf
    ps_rows: list = field(default_factory=list)  # --tf-cluster: (host, its tasks, their ports) (check/ps_ports.py)

    @property
    def perf_findings(self) -> list:
        from trainrun.check.perf_verdict import findings

        return findings(self.perf) if self.perf is not None else []

    @property
    def degraded(self) -> bool:
        """--perf found an outlier or a mismatch (the job can run, but slower or unevenly)."""
        return any(f.degrades for f in self.perf_findings)

    @property
    def ok(self) -> bool:
        return not self.problems


def evaluate(hosts: list[HostCheck], nics: list[str], local_ranks: dict[str, int], *, need_nic: bool,
             allow_gpu_sharing: bool, gpus_per_proc: int | None, mpi: bool) -> tuple[list[str], list[str]]:
    """Problems (the job cannot run) and warnings (it can, but look) from the collected facts. Pure."""
    problems, warnings = [], []
    for h in hosts:
        if not h.ok:
            problems.append(f"{h.host}: {h.stage}: {h.error}")
    reached = [h for h in hosts if h.ok]
    for h in reached:
        f = h.facts
        if f.trainrun != __version__:
            problems.append(f"{h.host}: trainrun {f.trainrun} there, {__version__} here; install the same version on every host")
        gpus = len(f.gpus)
        need = local_ranks.get(h.host, 0) * (gpus_per_proc or 1)
        if gpus and need > gpus and not allow_gpu_sharing:
            if gpus_per_proc:
                problems.append(f"{h.host}: {need} GPU(s) needed for its local ranks but it has {gpus}; lower -np or pass --allow-gpu-sharing")
            else:
                warnings.append(f"{h.host}: {need} local ranks share {gpus} GPU(s); CUDA collectives then need "
                                "--allow-gpu-sharing (through host memory: NCCL needs one GPU per rank)")
        if mpi and not f.mpi:
            problems.append(f"{h.host}: no usable MPI ({f.mpi_error or 'mpi4py missing'}); pip install mpi4py mpich, or pass --mpi none")
    pythons = {h.facts.python_version.rsplit(".", 1)[0] for h in reached}
    if len(pythons) > 1:
        warnings.append(f"hosts run different Python versions: {', '.join(sorted(pythons))}")
    vendors = {h.facts.vendor for h in reached if h.facts.mpi}
    if mpi and len(vendors) > 1:
        problems.append(f"hosts have different MPIs ({', '.join(sorted(map(str, vendors)))}); use one MPI everywhere")
    if need_nic and not nics and len(reached) == len(hosts):
        problems.append("no network interface routes between all hosts; check cabling/firewalls, or pin one with --network-interface")
    return problems, warnings


def gpu_summary(f) -> str:
    """"1 x NVIDIA H100 80GB HBM3 (81559 MiB, driver 580.159.04)", or the count alone ("0")."""
    if not f.gpu_models:
        return str(len(f.gpus))
    details = [f"{f.gpu_memory_mib[0]} MiB"] if f.gpu_memory_mib else []
    details += [f"driver {f.cuda_driver}"] if f.cuda_driver else []
    return f"{len(f.gpus)} x {f.gpu_models[0]}" + (f" ({', '.join(details)})" if details else "")


def render_report(r: CheckReport, color: bool = False) -> str:
    out = [f"Hosts ({r.source})" if r.source else "Hosts"]
    rows: list[tuple[object, ...]] = []
    for h in r.hosts:
        f = h.facts
        if h.ok:
            gpus = gpu_summary(f)
            rows.append((h.host, "local" if h.via == "local" else "ok", f.hostname, f.distro or f.os, f.python_version,
                         f.trainrun, f.vendor or "none", f.cpus, gpus, h.slots))
        else:
            rows.append((h.host, f"FAILED at {h.stage}", h.error, "", "", "", "", "", "", h.slots))
    out += render_table(("HOST", "REACH", "HOSTNAME", "OS", "PYTHON", "TRAINRUN", "MPI", "CPUS", "GPUS", "SLOTS"), rows, "  ")
    if r.nic_rows:
        out += ["", "Network interfaces"]
        out += render_table(("HOST", "NIC", "ADDRESSES", "UP", "SPEED", "VERDICT"), r.nic_rows, "  ")
        out.append(f"  routable between all hosts: {', '.join(r.nics) or 'none'}")
    if r.ranks:
        out += ["", "Rank plan"]
        out += render_table(
            ("RANK", "HOST", "LOCAL", "CROSS", "GPUS"),
            [(a.rank, a.host, f"{a.local_rank}/{a.local_size}", f"{a.cross_rank}/{a.cross_size}", ",".join(map(str, a.gpus)) or "-") for a in r.ranks], "  ")
    if r.ps_rows:
        out += ["", "Parameter-server cluster (ports each host's tasks will use; every host reached every ps on its port"
                    " unless a problem below says otherwise)"]
        out += render_table(("HOST", "TASKS", "PORTS"), r.ps_rows, "  ")
    out.append("")
    out += [f"warning: {w}" for w in r.warnings]
    out += [f"problem: {p}" for p in r.problems]
    n = len(r.hosts)
    out.append(f"verdict: OK, {len(r.ranks)} rank(s) on {n} host(s) can run" if r.ok else f"verdict: FAILED, {len(r.problems)} problem(s); the job would not run")
    if r.perf is not None:
        from trainrun.check.perf_render import render_perf

        out += render_perf(r.perf, r.perf_findings, color)
    return "\n".join(out)


def report_json(r: CheckReport) -> str:
    perf = None
    if r.perf is not None:
        from trainrun.check.perf_render import perf_json

        perf = perf_json(r.perf, r.perf_findings)
    return json.dumps({
        "ok": r.ok,
        "hosts_from": r.source,
        "problems": r.problems,
        "warnings": r.warnings,
        "hosts": [{"host": h.host, "ok": h.ok, "stage": h.stage, "error": h.error, "slots": h.slots, "facts": h.facts.to_json() if h.ok else {}} for h in r.hosts],
        "nics": r.nics,
        "nic_table": [dict(zip(("host", "nic", "addresses", "up", "speed", "verdict"), row)) for row in r.nic_rows],
        "ranks": [{"rank": a.rank, "host": a.host.name, "local_rank": a.local_rank, "cross_rank": a.cross_rank, "gpus": list(a.gpus)} for a in r.ranks],
        "perf": perf,
        **({"tf_cluster": [dict(zip(("host", "tasks", "ports"), row)) for row in r.ps_rows]} if r.ps_rows else {}),
    }, indent=2)
