"""`trainrun --check`: can this job run? Per host: reachability and facts; across hosts: NICs; then the plan.

The pure part (`evaluate`, `render_report`, `report_json`) turns collected results into problems, a
verdict and tables; `run_check` (check_run.py) collects them. A report is OK only when the job could
run as asked: every host reached and set up, enough GPUs for the local ranks (or sharing allowed),
one MPI across hosts, and, with several hosts, at least one NIC routable between all of them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from trainrun import __version__


@dataclass(frozen=True)
class HostCheck:
    host: str
    slots: int
    stage: str | None = None  # the stage that failed (dns, tcp, ssh, hostkey, auth, facts), None if OK
    error: str = ""
    facts: dict = field(default_factory=dict)
    via: str = "ssh"  # or "local": this machine, no SSH

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

    @property
    def ok(self) -> bool:
        return not self.problems


def evaluate(hosts: list[HostCheck], nics: list[str], local_ranks: dict[str, int], *, need_nic: bool,
             allow_gpu_sharing: bool, gpus_per_proc: int, mpi: bool) -> tuple[list[str], list[str]]:
    """Problems (the job cannot run) and warnings (it can, but look) from the collected facts. Pure."""
    problems, warnings = [], []
    for h in hosts:
        if not h.ok:
            problems.append(f"{h.host}: {h.stage}: {h.error}")
    reached = [h for h in hosts if h.ok]
    for h in reached:
        f = h.facts
        if f.get("trainrun") != __version__:
            problems.append(f"{h.host}: trainrun {f.get('trainrun')} there, {__version__} here; install the same version on every host")
        gpus = len(f.get("gpus", []))
        need = local_ranks.get(h.host, 0) * gpus_per_proc
        if gpus and need > gpus and not allow_gpu_sharing:
            problems.append(f"{h.host}: {need} GPU(s) needed for its local ranks but it has {gpus}; lower -np or pass --allow-gpu-sharing")
        if mpi and not f.get("mpi"):
            problems.append(f"{h.host}: no usable MPI ({f.get('error', 'mpi4py missing')}); pip install mpi4py mpich, or pass --mpi none")
    pythons = {h.facts.get("python_version", "").rsplit(".", 1)[0] for h in reached}
    if len(pythons) > 1:
        warnings.append(f"hosts run different Python versions: {', '.join(sorted(pythons))}")
    vendors = {h.facts.get("vendor") for h in reached if h.facts.get("mpi")}
    if mpi and len(vendors) > 1:
        problems.append(f"hosts have different MPIs ({', '.join(sorted(map(str, vendors)))}); use one MPI everywhere")
    if need_nic and not nics and len(reached) == len(hosts):
        problems.append("no network interface routes between all hosts; check cabling/firewalls, or pin one with --network-interface")
    return problems, warnings


def _table(header: tuple, rows: list[tuple]) -> list[str]:
    rows = [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]


def render_report(r: CheckReport) -> str:
    out = ["Hosts"]
    rows = []
    for h in r.hosts:
        f = h.facts
        if h.ok:
            gpus = f"{len(f.get('gpus', []))}" + (f" x {f['gpu_models'][0]}" if f.get("gpu_models") else "")
            mpi = f.get("vendor") or "none"
            rows.append((h.host, "local" if h.via == "local" else "ok", f.get("hostname", ""), f.get("distro") or f.get("os", ""), f.get("python_version", ""),
                         f.get("trainrun", ""), mpi, f.get("cpus", ""), gpus, h.slots))
        else:
            rows.append((h.host, f"FAILED at {h.stage}", h.error, "", "", "", "", "", "", h.slots))
    out += ["  " + line for line in _table(("HOST", "REACH", "HOSTNAME", "OS", "PYTHON", "TRAINRUN", "MPI", "CPUS", "GPUS", "SLOTS"), rows)]
    if r.nic_rows:
        out += ["", "Network interfaces"]
        out += ["  " + line for line in _table(("HOST", "NIC", "ADDRESSES", "UP", "SPEED", "VERDICT"), r.nic_rows)]
        out.append(f"  routable between all hosts: {', '.join(r.nics) or 'none'}")
    if r.ranks:
        out += ["", "Rank plan"]
        out += ["  " + line for line in _table(
            ("RANK", "HOST", "LOCAL", "CROSS", "GPUS"),
            [(a.rank, a.host, f"{a.local_rank}/{a.local_size}", f"{a.cross_rank}/{a.cross_size}", ",".join(map(str, a.gpus)) or "-") for a in r.ranks])]
    out.append("")
    out += [f"warning: {w}" for w in r.warnings]
    out += [f"problem: {p}" for p in r.problems]
    n = len(r.hosts)
    out.append(f"verdict: OK, {len(r.ranks)} rank(s) on {n} host(s) can run" if r.ok else f"verdict: FAILED, {len(r.problems)} problem(s); the job would not run")
    return "\n".join(out)


def report_json(r: CheckReport) -> str:
    return json.dumps({
        "ok": r.ok,
        "problems": r.problems,
        "warnings": r.warnings,
        "hosts": [{"host": h.host, "ok": h.ok, "stage": h.stage, "error": h.error, "slots": h.slots, "facts": h.facts} for h in r.hosts],
        "nics": r.nics,
        "nic_table": [dict(zip(("host", "nic", "addresses", "up", "speed", "verdict"), row)) for row in r.nic_rows],
        "ranks": [{"rank": a.rank, "host": a.host.name, "local_rank": a.local_rank, "cross_rank": a.cross_rank, "gpus": list(a.gpus)} for a in r.ranks],
    }, indent=2)
