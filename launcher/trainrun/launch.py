"""From a LaunchConfig to a finished job: hosts -> placement -> plan -> ProcessGroup -> exit code.

This is the one place the steps are put together; each step lives in its own module.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import uuid

from trainrun.config import LaunchConfig
from trainrun.envcontract import JobInfo
from trainrun.errors import UsageError
from trainrun.job import ProcessGroup
from trainrun.output import OutputSink
from trainrun.placement import assign_ranks
from trainrun.plan import LaunchPlan, build_plan, plan_json, plan_table
from trainrun.program import check_local_program, command_argv

log = logging.getLogger("trainrun")


def free_port(addr: str = "127.0.0.1") -> int:
    """A TCP port that is free now on `addr` (for torch's env:// rendezvous, MASTER_PORT)."""
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def make_plan(cfg: LaunchConfig) -> LaunchPlan:
    hosts = cfg.host_specs()
    remote = [h for h in hosts if not h.is_local]
    if remote:
        raise UsageError(f"host {remote[0]} is not this machine: remote hosts need SSH support, which this version does not have yet")
    check_local_program(cfg.command)
    argv = command_argv(cfg.command)
    from trainrun.gpus import local_gpu_pool

    pool = local_gpu_pool()
    np = cfg.num_proc if cfg.num_proc is not None else sum(h.slots for h in hosts)
    assignments = assign_ranks(
        hosts, np, oversubscribe=cfg.oversubscribe,
        gpu_pools={h.name: pool for h in hosts}, gpus_per_proc=cfg.gpus_per_proc or 1,
        allow_gpu_sharing=cfg.allow_gpu_sharing,
    )
    job = JobInfo(
        job_id=uuid.uuid4().hex[:12], master_addr="127.0.0.1", master_port=free_port(),
        isolate_gpus=cfg.gpus_per_proc is not None,
    )
    return build_plan(assignments, job, argv, os.getcwd(), cfg.exported_env(os.environ), cfg.bind_to)


def launch(cfg: LaunchConfig) -> int:
    """Plan, then print it (--dry-run) or run it. Returns the launcher's exit code."""
    plan = make_plan(cfg)
    if cfg.dry_run:
        print(plan_json(plan) if cfg.json else plan_table(plan))
        return 0
    log.info("job %s: %d rank(s) on %s", plan.job.job_id, len(plan.procs), ", ".join(plan.by_host()))
    sink = OutputSink(cfg.prefix, cfg.output_dir)
    group = ProcessGroup(plan, sink, grace=cfg.grace, mpi=cfg.mpi != "none", start_timeout=cfg.start_timeout)
    result = group.run()
    summary = result.summary(len(plan.procs))
    if summary:
        print(summary, file=sys.stderr, flush=True)
    return result.exit_code
