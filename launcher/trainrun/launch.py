"""From a LaunchConfig to an exit code, top-down: shape the job, reach the hosts (one agent each),
choose the NICs, plan every rank, run the rank groups under one Job, report. Each step lives in its
own subpackage (plan/, fanout/, net/, supervisor/, mpiworld/, check/); this module only puts them in order.
The planning and the Job are assembled as for each attempt of an elastic job (supervisor/assemble.py).
"""
from __future__ import annotations

import os
import sys

from trainrun.cli.config import LaunchConfig
from trainrun.fanout.select import HostSource, host_source
from trainrun.plan.planner import JobShape, make_plan, shape_job
from trainrun.supervisor.output import prepare_output_dir, sink_for

AGENT_START_SLACK = 30.0  # seconds beyond --ssh-timeout for an agent's HELLO (interpreter start-up on a busy host)


def launch(cfg: LaunchConfig) -> int:
    """Plan, then print it (--dry-run), check the hosts (--check) or run it. Returns the exit code."""
    cfg.exported_env(os.environ)  # a bad or unset -x is a usage error before any host is reached
    if cfg.check:
        return check(cfg)
    elastic = cfg.elastic_settings()
    if elastic.enabled and not cfg.dry_run:
        from trainrun.supervisor.restarts import run_elastic

        if cfg.output_dir:
            prepare_output_dir(cfg.output_dir)
        return run_elastic(cfg)
    source = host_source(cfg, os.environ)
    shape = shape_job(cfg, source.hosts, source.default_np)
    cfg.shown_ranks(shape.np)  # a --ranks beyond the job is a usage error before any host is reached
    if shape.has_local:
        from trainrun.plan.program import check_local_program

        check_local_program(cfg.command)
    if cfg.output_dir and not cfg.dry_run:
        prepare_output_dir(cfg.output_dir)
    facts = {}
    if shape.has_local:
        from trainrun.facts.collect import launch_facts

        here = launch_facts()
        facts = {h.name: here for h in shape.used if h.is_local}
    if cfg.dry_run:
        return dry_run(cfg, source, shape, facts)
    if cfg.mpi == "openmpi":  # mpirun does its own fan-out
        from trainrun.supervisor.mpirun import run_openmpi

        plan = make_plan(cfg, shape, facts, "127.0.0.1" if not shape.remote else shape.used[0].name)
        return run_openmpi(plan, sink_for(cfg, len(plan.procs)), oversubscribe=cfg.oversubscribe, grace=cfg.grace)
    return run_job(cfg, source, shape, facts)


def dry_run(cfg: LaunchConfig, source: HostSource, shape: JobShape, facts: dict) -> int:
    from trainrun.plan.render import plan_json, plan_table

    plan = make_plan(cfg, shape, facts, "127.0.0.1" if not shape.remote else shape.used[0].name,
                     slurm=source.allocation is not None)
    notes = {"hosts": source.reason, **({"engine": source.engine} if shape.remote else {})}
    if cfg.tf_cluster is not None:
        notes["mpi"] = "none (--tf-cluster: the tasks are TensorFlow servers, not an MPI world)"
    if "TRAINRUN_HOROVOD" in plan.procs[0].env:
        from trainrun._horovod import describe

        notes["horovod"] = describe(plan.procs[0].env["TRAINRUN_HOROVOD"])
    elastic = cfg.elastic_settings()
    if cfg.json:
        import json

        doc = json.loads(plan_json(plan, notes))
        if elastic.enabled:
            doc["elastic"] = elastic.to_json()
        print(json.dumps(doc, indent=2))
    else:
        print(plan_table(plan, notes))
        if elastic.enabled:
            print(elastic.describe())
    return 0


def run_job(cfg: LaunchConfig, source: HostSource, shape: JobShape, facts: dict) -> int:
    """Reach the remote hosts, choose the NICs, run the job's one attempt (supervisor/assemble.py) to the end."""
    from trainrun.supervisor.assemble import assemble_job

    engine, agents = None, {}
    if shape.remote:
        from trainrun.fanout.agents import open_agents
        from trainrun.fanout.select import engine_for

        engine = engine_for(cfg, source)
        agents = open_agents(engine, shape.remote, timeout=cfg.ssh_timeout + AGENT_START_SLACK)
    try:
        facts = {**facts, **{name: agent.facts for name, agent in agents.items()}}
        nics: tuple[str, ...] = ()
        if agents:
            from trainrun.net.choice import choose_nics

            nics = choose_nics(cfg, shape.used, engine, facts)
        job = assemble_job(cfg, shape, agents, facts, nics, slurm=source.allocation is not None)
        plan, result = job.plan, job.run()
    finally:
        for agent in agents.values():
            agent.disconnect()
        if engine is not None:
            engine.close()
    summary = result.summary(len(plan.procs))
    if summary:
        print(summary, file=sys.stderr, flush=True)
    return result.exit_code


def check(cfg: LaunchConfig) -> int:
    """`--check`: print the report; 0 if the job could run, else CheckFailed's code (also when --perf-strict
    and --perf found the job would run degraded)."""
    from trainrun.check.collect import run_check
    from trainrun.check.report import render_report, report_json
    from trainrun.errors import CheckFailed

    report = run_check(cfg)
    elastic = cfg.elastic_settings()
    if cfg.json:
        import json

        doc = json.loads(report_json(report))
        if elastic.enabled:
            doc["elastic"] = elastic.to_json()
        print(json.dumps(doc, indent=2))
    else:
        print(render_report(report, sys.stdout.isatty() and "NO_COLOR" not in os.environ))
        if elastic.enabled:
            print(elastic.describe())
    if not report.ok or (cfg.perf_strict and report.degraded):
        return CheckFailed.exit_code
    return 0
