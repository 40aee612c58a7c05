"""LaunchPlan: every process of the job, fully decided before anything starts. Pure.

A plan is what `--dry-run` prints and what executors run: one ProcessSpec per rank with its host,
argv, the env trainrun adds, its working directory and CPU binding policy.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from trainrun.envcontract import JobInfo, rank_env
from trainrun.hosts import HostSpec
from trainrun.placement import RankAssignment


_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.I)


def redacted(env: dict[str, str]) -> dict[str, str]:
    """env with the values of secret-looking variables (API keys, tokens, passwords) masked, for printing."""
    return {k: ("<redacted>" if _SECRET.search(k) else v) for k, v in env.items()}


@dataclass(frozen=True)
class ProcessSpec:
    assignment: RankAssignment
    argv: tuple[str, ...]
    env: dict  # what trainrun adds on top of the host's environment
    cwd: str
    bind_to: str = "none"

    @property
    def rank(self) -> int:
        return self.assignment.rank

    @property
    def host(self) -> str:
        return self.assignment.host.name


@dataclass(frozen=True)
class LaunchPlan:
    job: JobInfo
    procs: tuple[ProcessSpec, ...]

    def by_host(self) -> dict[str, list[ProcessSpec]]:
        """Processes grouped by host, hosts in node-rank order."""
        out: dict[str, list[ProcessSpec]] = {}
        for p in self.procs:
            out.setdefault(p.host, []).append(p)
        return out


def build_plan(
    assignments: list[RankAssignment],
    job: JobInfo,
    argv: tuple[str, ...],
    cwd: str,
    extra_env: dict[str, str],
    bind_to: str = "none",
) -> LaunchPlan:
    procs = tuple(  # what the user exports with -x wins over what trainrun derives (e.g. the NIC choice)
        ProcessSpec(a, argv, {**rank_env(a, job), **extra_env}, cwd, bind_to) for a in assignments
    )
    return LaunchPlan(job, procs)


def plan_table(plan: LaunchPlan) -> str:
    """Human-readable plan: one row per rank, then the env rank 0 gets."""
    rows = [("RANK", "HOST", "LOCAL", "CROSS", "NODE", "GPUS", "BIND", "COMMAND")]
    for p in plan.procs:
        a = p.assignment
        rows.append((
            str(a.rank), str(a.host), f"{a.local_rank}/{a.local_size}", f"{a.cross_rank}/{a.cross_size}",
            f"{a.node_rank}/{a.nnodes}", ",".join(map(str, a.gpus)) or "-", p.bind_to, shlex.join(p.argv),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    lines.append("")
    lines.append(f"job {plan.job.job_id}: {len(plan.procs)} rank(s) on {len(plan.by_host())} host(s), cwd {plan.procs[0].cwd}")
    lines.append("environment added to rank 0 (other ranks differ in their rank numbers):")
    lines += [f"  {k}={v}" for k, v in sorted(redacted(plan.procs[0].env).items())]
    return "\n".join(lines)


def plan_json(plan: LaunchPlan) -> str:
    job = plan.job
    doc = {
        "job_id": job.job_id,
        "master_addr": job.master_addr,
        "master_port": job.master_port,
        "nics": list(job.nics),
        "ranks": [
            {
                "rank": p.rank, "host": str(p.assignment.host), "local_rank": p.assignment.local_rank,
                "local_size": p.assignment.local_size, "cross_rank": p.assignment.cross_rank,
                "cross_size": p.assignment.cross_size, "node_rank": p.assignment.node_rank,
                "nnodes": p.assignment.nnodes, "gpus": list(p.assignment.gpus), "bind_to": p.bind_to,
                "argv": list(p.argv), "cwd": p.cwd, "env": redacted(p.env),
            }
            for p in plan.procs
        ],
    }
    return json.dumps(doc, indent=2)


def spec_to_dict(p: ProcessSpec) -> dict:
    """A ProcessSpec as JSON-able data, for the agent that runs it on its host."""
    a = p.assignment
    return {
        "argv": list(p.argv), "env": p.env, "cwd": p.cwd, "bind_to": p.bind_to,
        "host": {"name": a.host.name, "slots": a.host.slots, "user": a.host.user},
        "assignment": {k: getattr(a, k) for k in (
            "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size", "node_rank", "nnodes")},
        "gpus": list(a.gpus),
    }


def spec_from_dict(d: dict) -> ProcessSpec:
    host = HostSpec(**d["host"])
    a = RankAssignment(host=host, gpus=tuple(d["gpus"]), **d["assignment"])
    return ProcessSpec(a, tuple(d["argv"]), dict(d["env"]), d["cwd"], d["bind_to"])
