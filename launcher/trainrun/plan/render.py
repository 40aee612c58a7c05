"""The plan as people and scripts read it: `--dry-run`'s table and JSON. Pure; secrets masked."""
from __future__ import annotations

import json
import re
import shlex
from typing import Mapping

from trainrun.plan.roles import cluster_of
from trainrun.plan.spec import LaunchPlan

_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.I)


def redacted(env: Mapping[str, str]) -> dict[str, str]:
    """env with the values of secret-looking variables (API keys, tokens, passwords) masked, for printing."""
    return {k: ("<redacted>" if _SECRET.search(k) else v) for k, v in env.items()}


def plan_table(plan: LaunchPlan, notes: Mapping[str, str] | None = None) -> str:
    """Human-readable plan: one row per rank, the job line, `notes` ({what: why}), then the env rank 0 gets."""
    from trainrun.table import render_table

    rows, tasks = [], plan.job.tf_tasks  # --tf-cluster: each rank's role:index and TF address too
    for p in plan.procs:
        a = p.assignment
        role = (f"{tasks[a.rank].role}:{tasks[a.rank].index}", plan.job.tf_workers[a.rank]) if tasks else ()
        rows.append((
            a.rank, *role, a.host, f"{a.local_rank}/{a.local_size}", f"{a.cross_rank}/{a.cross_size}",
            f"{a.node_rank}/{a.nnodes}", ",".join(map(str, a.gpus)) or "-", p.bind_to, shlex.join(p.argv),
        ))
    head = ("RANK", *(("ROLE", "ADDRESS") if tasks else ()), "HOST", "LOCAL", "CROSS", "NODE", "GPUS", "BIND", "COMMAND")
    lines = render_table(head, rows)
    lines.append("")
    lines.append(f"job {plan.job.job_id}: {len(plan.procs)} rank(s) on {len(plan.by_host())} host(s), cwd {plan.procs[0].cwd}")
    lines += [f"{k}: {v}" for k, v in (notes or {}).items()]
    if tasks:
        lines.append("TF_CONFIG: the cluster above by role, and each rank's own task (TRAINRUN_ROLE, TRAINRUN_ROLE_INDEX)")
    lines.append("environment added to rank 0 (other ranks differ in their rank numbers):")
    lines += [f"  {k}={v}" for k, v in sorted(redacted(plan.procs[0].env).items())]
    return "\n".join(lines)


def plan_json(plan: LaunchPlan, notes: Mapping[str, str] | None = None) -> str:
    """The plan as JSON: the job, then every rank with its env. TF_CONFIG is given once, as "tf_workers" (each
    rank's TF_CONFIG is that worker list with its rank as the task index), not in every rank's env: listing
    every worker per rank would make the document quadratic in the ranks (92 GB at 65536 ranks)."""
    job = plan.job
    doc = {
        **(notes or {}),
        "job_id": job.job_id,
        "master_addr": job.master_addr,
        "master_port": job.master_port,
        "nics": list(job.nics),
        "tf_workers": list(job.tf_workers),
        **({"tf_cluster": cluster_of(job.tf_tasks, job.tf_workers)} if job.tf_tasks else {}),
        "ranks": [
            {
                "rank": p.rank, "host": str(p.assignment.host), "local_rank": p.assignment.local_rank,
                "local_size": p.assignment.local_size, "cross_rank": p.assignment.cross_rank,
                "cross_size": p.assignment.cross_size, "node_rank": p.assignment.node_rank,
                "nnodes": p.assignment.nnodes, "gpus": list(p.assignment.gpus), "bind_to": p.bind_to,
                "argv": list(p.argv), "cwd": p.cwd,
                **({"role": job.tf_tasks[p.rank].role, "role_index": job.tf_tasks[p.rank].index,
                    "address": job.tf_workers[p.rank]} if job.tf_tasks else {}),
                "env": redacted({k: p.env[k] for k in p.env if k != "TF_CONFIG"}),
            }
            for p in plan.procs
        ],
    }
    return json.dumps(doc, indent=2)
