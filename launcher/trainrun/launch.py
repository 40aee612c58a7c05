"""From a LaunchConfig to an exit code, top-down: resolve the options once (launchspec.py), shape the job,
reach the hosts (one agent each), choose the NICs, plan every rank, run the rank groups under one Job,
report. Each step lives in its own subpackage (plan/, fanout/, net/, supervisor/, mpiworld/, check/); this
module only puts them in order, the same order for every mode:

    static        shape -> reach -> facts -> NICs -> plan -> Job            (run_job)
    elastic       the same per attempt                                      (elasticjob/loop.py)
    --mpi openmpi shape -> facts (this machine's) -> NICs (--network-interface) -> plan -> Job over mpirun
    --dry-run     shape -> facts (this machine's) -> NICs (--network-interface) -> plan -> print
    --check       shape -> reach -> facts -> NICs -> assign -> report        (check/pipeline.py)

The modes that reach no host (mpirun does its own fan-out; a dry run connects nowhere) plan with the routes a
launch would take by name (plan/planner.named_routes), through the same MASTER_ADDR and host-address rule.
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from trainrun.launchspec import LaunchSpec, resolve
from trainrun.plan.planner import JobShape, plan_job, shape_job
from trainrun.supervisor.output import prepare_output_dir, sink_for

if TYPE_CHECKING:
    from trainrun.config import LaunchConfig
    from trainrun.plan.spec import LaunchPlan


def launch(cfg: LaunchConfig) -> int:
    """Resolve the options, then plan and print it (--dry-run), check the hosts (--check) or run it. Returns
    the exit code. `cfg` is read here and by launchspec.resolve only."""
    spec = resolve(cfg, os.environ)  # a bad or unset -x, a failing discovery script: usage errors before any host is reached
    if spec.mode == "check":
        return check(spec)
    if spec.elastic is not None and spec.mode == "run":
        from trainrun.elasticjob.loop import run_elastic

        if spec.output.output_dir:
            prepare_output_dir(spec.output.output_dir)
        return run_elastic(spec)
    shape = shape_job(spec.plan, spec.hosts.hosts, spec.hosts.default_np)
    spec.output.shown(shape.np)  # a --ranks beyond the job is a usage error before any host is reached
    if shape.has_local:
        from trainrun.plan.program import check_local_program

        check_local_program(spec.plan.command)
    if spec.output.output_dir and spec.mode == "run":
        prepare_output_dir(spec.output.output_dir)
    facts = local_facts(shape)
    if spec.mode == "dry-run":
        return dry_run(spec, shape, facts)
    if spec.plan.mpi == "openmpi":  # mpirun does its own fan-out
        from trainrun.supervisor.mpirun import run_openmpi

        plan = unreached_plan(spec, shape, facts)
        return run_openmpi(plan, sink_for(spec.output, len(plan.procs)), spec.supervision, spec.output,
                           oversubscribe=spec.plan.oversubscribe, nics=plan.job.nics)
    return run_job(spec, shape, facts)


def local_facts(shape: JobShape) -> dict:
    """This machine's facts for each of its host entries in `shape` (none when it has no ranks)."""
    if not shape.has_local:
        return {}
    from trainrun.facts.collect import launch_facts

    here = launch_facts()
    return {h.name: here for h in shape.used if h.is_local}


def unreached_plan(spec: LaunchSpec, shape: JobShape, facts: dict) -> LaunchPlan:
    """The plan of a mode that reaches no remote host (--dry-run, --mpi openmpi): the NICs by the launch's
    rule (--network-interface; no probe without the hosts), the routes by name (plan/planner.named_routes)."""
    import socket

    from trainrun.net.choice import choose_nics
    from trainrun.plan.planner import named_routes

    nics = choose_nics(spec.nics, shape.used, None, facts)
    return plan_job(spec.plan, shape, facts, named_routes(shape.used, socket.gethostname()), nics,
                    slurm=spec.hosts.allocation is not None)


def dry_run(spec: LaunchSpec, shape: JobShape, facts: dict) -> int:
    from trainrun.plan.render import plan_json, plan_table

    source = spec.hosts
    plan = unreached_plan(spec, shape, facts)
    notes = {"hosts": source.reason, **({"engine": source.engine} if shape.remote else {})}
    if spec.plan.tf_cluster is not None:
        notes["mpi"] = "none (--tf-cluster: the tasks are TensorFlow servers, not an MPI world)"
    if "TRAINRUN_HOROVOD" in plan.procs[0].env:
        from trainrun.plan.horovod_shim import describe

        notes["horovod"] = describe(plan.procs[0].env["TRAINRUN_HOROVOD"])
    print_with_elastic(spec, plan_json(plan, notes) if spec.output.json else plan_table(plan, notes))
    return 0


def print_with_elastic(spec: LaunchSpec, text: str) -> None:
    """--dry-run's and --check's printout, with the elastic settings (a JSON key, or a line after the table);
    the JSON also holds the supervision every mode's Job would run under (its timeouts, resolved once)."""
    elastic = spec.elastic
    if spec.output.json:
        import json

        doc = json.loads(text)
        if elastic is not None:
            doc["elastic"] = elastic.to_json()
        sup = spec.supervision
        doc["supervision"] = {**sup._asdict(), "host_answer": sup.host_answer}
        print(json.dumps(doc, indent=2))
    else:
        print(text)
        if elastic is not None:
            print(elastic.describe())


def run_job(spec: LaunchSpec, shape: JobShape, facts: dict) -> int:
    """Reach the remote hosts, choose the NICs, run the job's one attempt (supervisor/assemble.py) to the end."""
    from trainrun.supervisor.assemble import assemble_job

    engine, agents = None, {}
    if shape.remote:
        from trainrun.fanout.agents import open_agents
        from trainrun.fanout.select import engine_for

        engine = engine_for(spec.reach, spec.hosts)
        agents = open_agents(engine, shape.remote, timeout=spec.supervision.host_answer)
    try:
        facts = {**facts, **{name: agent.facts for name, agent in agents.items()}}
        from trainrun.net.choice import choose_nics

        nics = choose_nics(spec.nics, shape.used, engine, facts)
        job = assemble_job(spec.plan, spec.supervision, spec.output, shape, agents, facts, nics,
                           slurm=spec.hosts.allocation is not None)
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


def check(spec: LaunchSpec) -> int:
    """`--check`: print the report; 0 if the job could run, else CheckFailed's code (also when --perf-strict
    and --perf found the job would run degraded)."""
    from trainrun.check.pipeline import run_check
    from trainrun.check.report import render_report, report_json
    from trainrun.errors import CheckFailed

    report = run_check(spec)
    if spec.output.json:
        print_with_elastic(spec, report_json(report))
    else:
        print_with_elastic(spec, render_report(report, sys.stdout.isatty() and "NO_COLOR" not in os.environ))
    if not report.ok or (spec.perf_strict and report.degraded):
        return CheckFailed.exit_code
    return 0
