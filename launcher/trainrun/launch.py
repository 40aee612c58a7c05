"""From a LaunchConfig to a finished job: hosts -> placement -> (agents on remote hosts) -> plan ->
ProcessGroup -> exit code. The one place the steps are put together; each lives in its own module.
"""
from __future__ import annotations

import os
import sys

from trainrun import log
from trainrun.config import LaunchConfig
from trainrun.envcontract import JobInfo, forwarded_env
from trainrun.hosts import HostSpec
from trainrun.job import ProcessGroup
from trainrun.output import OutputSink, prepare_output_dir
from trainrun.placement import assign_ranks, ranks_per_host
from trainrun.plan import LaunchPlan, build_plan, plan_json, plan_table
from trainrun.program import check_local_program, command_argv



def used_hosts(cfg: LaunchConfig) -> tuple[list[HostSpec], int]:
    """The hosts that get ranks, and the number of ranks."""
    hosts = cfg.host_specs()
    np = cfg.num_proc if cfg.num_proc is not None else sum(h.slots for h in hosts)
    counts = ranks_per_host(hosts, np, cfg.oversubscribe)
    return [h for h, c in zip(hosts, counts) if c], np


def make_plan(cfg: LaunchConfig, hosts: list[HostSpec], np: int, facts: dict[str, dict], master_addr: str,
              nics: tuple[str, ...] = ()) -> LaunchPlan:
    """The whole job, decided. `facts` holds each host's HELLO facts (gpus, free_port); hosts without
    facts (a dry run's remote hosts) get no GPUs."""
    python = cfg.python or sys.executable
    assignments = assign_ranks(
        hosts, np, oversubscribe=cfg.oversubscribe,
        gpu_pools={h.name: tuple(facts.get(h.name, {}).get("gpus", ())) for h in hosts},
        gpus_per_proc=cfg.gpus_per_proc or 1, allow_gpu_sharing=cfg.allow_gpu_sharing,
    )
    rank0 = facts.get(hosts[0].name, {})
    job = JobInfo(
        job_id=os.urandom(6).hex(), master_addr=master_addr, master_port=rank0.get("free_port", 29500),
        nics=nics, isolate_gpus=cfg.gpus_per_proc is not None,
    )
    cwd = cfg.workdir or os.getcwd()
    return build_plan(assignments, job, command_argv(cfg.command, python), cwd, cfg.exported_env(os.environ), cfg.bind_to)


def launch(cfg: LaunchConfig) -> int:
    """Plan, then print it (--dry-run) or run it. Returns the launcher's exit code."""
    from trainrun.facts import launch_facts

    if cfg.check:
        return check(cfg)
    hosts, np = used_hosts(cfg)
    remote = [h for h in hosts if not h.is_local]
    if len(remote) < len(hosts):
        check_local_program(cfg.command)
    if cfg.output_dir and not cfg.dry_run:
        prepare_output_dir(cfg.output_dir)
    local = launch_facts() if len(remote) < len(hosts) else {}
    facts = {h.name: local for h in hosts if h.is_local}
    if cfg.dry_run:
        plan = make_plan(cfg, hosts, np, facts, "127.0.0.1" if not remote else hosts[0].name)
        print(plan_json(plan) if cfg.json else plan_table(plan))
        return 0
    if cfg.mpi == "openmpi":  # mpirun does its own fan-out
        from trainrun.openmpi import run_openmpi

        plan = make_plan(cfg, hosts, np, facts, "127.0.0.1" if not remote else hosts[0].name)
        return run_openmpi(plan, OutputSink(cfg.prefix, cfg.output_dir), oversubscribe=cfg.oversubscribe, grace=cfg.grace)
    agents = {}
    if remote:
        from trainrun.remote import open_agents

        agents = open_agents(remote, cfg)
    try:
        facts.update({name: agent.facts for name, agent in agents.items()})
        nics = ()
        if agents:
            from trainrun.check_run import choose_nics

            nics = choose_nics(cfg, hosts, {name: a.link.client for name, a in agents.items()},
                               {name: a.facts["python"] for name, a in agents.items()},
                               {name: a.facts.get("nics", []) for name, a in agents.items()})
        plan = make_plan(cfg, hosts, np, facts, master_address(hosts[0], agents, nics), nics)
        log.info("job %s: %d rank(s) on %s", plan.job.job_id, len(plan.procs), ", ".join(plan.by_host()))
        sink = OutputSink(cfg.prefix, cfg.output_dir)
        group = ProcessGroup(plan, sink, grace=cfg.grace, mpi=cfg.mpi != "none", start_timeout=cfg.start_timeout,
                             agents=agents, python=cfg.python or sys.executable, forward_env=forwarded_env(os.environ),
                             heartbeat_timeout=cfg.heartbeat_timeout)
        result = group.run()
    finally:
        for agent in agents.values():
            agent.disconnect()
    summary = result.summary(len(plan.procs))
    if summary:
        print(summary, file=sys.stderr, flush=True)
    return result.exit_code


def check(cfg: LaunchConfig) -> int:
    """`--check`: print the report; 0 if the job could run, else CheckFailed's code."""
    from trainrun.check_run import run_check
    from trainrun.checks import render_report, report_json
    from trainrun.errors import CheckFailed

    report = run_check(cfg)
    print(report_json(report) if cfg.json else render_report(report))
    return 0 if report.ok else CheckFailed.exit_code


def master_address(rank0_host: HostSpec, agents: dict, nics: tuple[str, ...] = ()) -> str:
    """An address of rank 0's host that every host can reach: its address on the first chosen NIC,
    loopback for a one-machine job, the address SSH reached rank 0's host at, or this machine's
    address on the route to the others."""
    if rank0_host.name in agents:
        for nic in agents[rank0_host.name].facts.get("nics", []):
            if nics and nic["name"] == nics[0] and nic["addresses"]:
                return nic["addresses"][0].split("/")[0]
        return agents[rank0_host.name].link.peer_address
    if agents:
        return next(iter(agents.values())).link.local_address
    return "127.0.0.1"
