"""From a LaunchConfig to an exit code, top-down: shape the job, reach the hosts (one agent each),
choose the NICs, plan every rank, run the rank groups under one Job, report. Each step lives in its
own subpackage (plan/, fanout/, net/, run/, mpi/, check/); this module only puts them in order.
"""
from __future__ import annotations

import os
import sys

from trainrun import log
from trainrun.cli.config import LaunchConfig
from trainrun.plan.planner import JobShape, make_plan, master_address, shape_job
from trainrun.run.output import OutputSink, prepare_output_dir

AGENT_START_SLACK = 30.0  # seconds beyond --ssh-timeout for an agent's HELLO (interpreter start-up on a busy host)


def launch(cfg: LaunchConfig) -> int:
    """Plan, then print it (--dry-run), check the hosts (--check) or run it. Returns the exit code."""
    if cfg.check:
        return check(cfg)
    shape = shape_job(cfg)
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
        return dry_run(cfg, shape, facts)
    if cfg.mpi == "openmpi":  # mpirun does its own fan-out
        from trainrun.mpi.openmpi import run_openmpi

        plan = make_plan(cfg, shape, facts, "127.0.0.1" if not shape.remote else shape.used[0].name)
        return run_openmpi(plan, OutputSink(cfg.prefix, cfg.output_dir), oversubscribe=cfg.oversubscribe, grace=cfg.grace)
    return run_job(cfg, shape, facts)


def dry_run(cfg: LaunchConfig, shape: JobShape, facts: dict) -> int:
    from trainrun.plan.render import plan_json, plan_table

    plan = make_plan(cfg, shape, facts, "127.0.0.1" if not shape.remote else shape.used[0].name)
    print(plan_json(plan) if cfg.json else plan_table(plan))
    return 0


def run_job(cfg: LaunchConfig, shape: JobShape, facts: dict) -> int:
    """Reach the remote hosts, plan with their facts, run every rank group to the end."""
    from trainrun.plan.envcontract import forwarded_env
    from trainrun.run.job import Job
    from trainrun.run.local import LocalRanks

    engine, agents = None, {}
    if shape.remote:
        from trainrun.fanout.agents import open_agents
        from trainrun.fanout.select import engine_for

        engine = engine_for(cfg)
        agents = open_agents(engine, shape.remote, timeout=cfg.ssh_timeout + AGENT_START_SLACK)
    try:
        facts = {**facts, **{name: agent.facts for name, agent in agents.items()}}
        nics = ()
        if agents:
            from trainrun.net.choice import choose_nics

            nics = choose_nics(cfg, shape.used, engine, facts)
        routes = {name: (a.link.peer_address, a.link.local_address) for name, a in agents.items()}
        plan = make_plan(cfg, shape, facts, master_address(shape.used[0], facts, routes, nics), nics)
        log.info("job %s: %d rank(s) on %s", plan.job.job_id, len(plan.procs), ", ".join(plan.by_host()))
        by_host, mpi = plan.by_host(), cfg.mpi != "none"
        local = [p for p in plan.procs if p.host not in agents]
        groups = [LocalRanks(local, pmi=mpi)] if local else []
        forward = forwarded_env(os.environ)
        for name, agent in agents.items():
            agent.assign(by_host[name], pmi=mpi, python=cfg.python or sys.executable, env=forward,
                         heartbeat_timeout=cfg.heartbeat_timeout)
            groups.append(agent)
        job = Job(plan, OutputSink(cfg.prefix, cfg.output_dir), groups, grace=cfg.grace,
                  start_timeout=cfg.start_timeout)
        result = job.run()
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
    color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    print(report_json(report) if cfg.json else render_report(report, color))
    if not report.ok or (cfg.perf_strict and report.degraded):
        return CheckFailed.exit_code
    return 0
