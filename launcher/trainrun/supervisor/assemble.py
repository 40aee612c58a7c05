"""One attempt of a job, assembled: from a JobShape on hosts already reached to a Job ready to run.

This is the one place a job is put together: plan every rank with the hosts' facts, give each agent its
host's share, gather this machine's ranks in a LocalRanks, and put every group under one Job. A static launch
(launch.run_job) runs one attempt; the elastic loop (elasticjob/loop.py) runs one per attempt, numbered. What the
callers keep is what differs between them: how the hosts are reached (agents opened for this job, or kept in
a pool between attempts), how the NICs are chosen (once, or cached across attempts), and what follows the
Job's end (a summary and an exit code, or the restart policy).

A static job is not the elastic loop run with no restarts (as torch's agent does): the loop's own parts (a
guardian process for the ranks' committed-state segments, the control server, agents kept in a pool between
attempts, the failure list it prints at the end) would cost every static launch start-up time and change
its messages. The attempt is what they share, and it is this function.
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from trainrun import log
from trainrun.plan.envcontract import forwarded_env
from trainrun.plan.planner import JobShape, PlanOptions, plan_job
from trainrun.supervisor.job import Job
from trainrun.supervisor.local import LocalRanks
from trainrun.supervisor.output import OutputOptions, sink_for
from trainrun.supervisor.supervision import Supervision

if TYPE_CHECKING:
    from trainrun.fanout.agents import AgentRanks
    from trainrun.plan.spec import LaunchPlan
    from trainrun.elasticjob.control import ControlServer
    from trainrun.supervisor.exit_policy import ExitPolicy
    from trainrun.supervisor.groups import RankGroup
    from trainrun.supervisor.job_output import JobOutput
    from trainrun.elasticjob.spares import SparePool


def assemble_job(opts: PlanOptions, sup: Supervision, out: OutputOptions, shape: JobShape,
                 agents: dict[str, AgentRanks], facts: dict, nics: tuple[str, ...], *, slurm: bool, attempt: int | None = None,
                 control: ControlServer | None = None, host_updates: bool = True,
                 spares: SparePool | None = None, policy: ExitPolicy | None = None) -> Job:
    """The Job that runs `shape`'s ranks: this machine's under a LocalRanks, each remote host's through its
    agent in `agents` (one per remote host of `shape`, each with its HELLO facts also in `facts`, which holds
    every used host's). `nics`: the NICs the ranks use (() for one host). `opts`, `sup`, `out`: the launch's
    resolved options (launchspec.py): what planning reads, every timeout, the output.

    `attempt`: None for a static job, else the elastic attempt number: the ranks get TRAINRUN_RESTART_COUNT
    and TRAINRUN_ELASTIC. `policy`: how the Job judges its ranks' exits (exit_policy.py): the elastic loop's
    AttemptPolicy for its attempt (elasticjob/attempt.py); None: a static job's, or with --tf-cluster the
    parameter-server policy (ps_policy.py). `control`: an elastic job's control channels for this machine's ranks.
    `host_updates`: whether the launcher may tell this attempt's ranks that the hosts changed (elastic
    sizing); they get TRAINRUN_HOST_UPDATES=0 when not, and their commit() then skips the host-update check
    (a broadcast from rank 0 per commit: a fifth of a 1 MiB commit's time). `spares`: an elastic job's warm
    ranks for this machine's ranks (elasticjob/spares.py)."""
    routes = {name: (a.link.peer_address, a.link.local_address) for name, a in agents.items()}
    plan = plan_job(opts, shape, facts, routes, nics, slurm=slurm)
    if attempt is None:
        log.info("job %s: %d rank(s) on %s", plan.job.job_id, len(plan.procs), ", ".join(plan.by_host()))
    else:
        from trainrun.plan.spec import with_env

        plan = with_env(plan, {"TRAINRUN_RESTART_COUNT": str(attempt), "TRAINRUN_ELASTIC": "1",
                               "TRAINRUN_HOST_UPDATES": "1" if host_updates else "0"})
        log.info("attempt %d: job %s, %d rank(s) on %s", attempt, plan.job.job_id, len(plan.procs),
                 ", ".join(plan.by_host()))
    ps = opts.tf_cluster is not None  # never elastic (config.py): its workers restart in place instead
    by_host, mpi = plan.by_host(), opts.mpi != "none" and not ps  # PS tasks are TF servers: no MPI world
    local = [p for p in plan.procs if p.host not in agents]
    if mpi:
        check_shm_room(by_host, facts, set(agents))
    groups: list[RankGroup] = [LocalRanks(local, pmi=mpi, control=control, spares=spares)] if local else []
    forward = forwarded_env(os.environ)
    for name, agent in agents.items():
        agent.assign(by_host[name], pmi=mpi, python=opts.python or sys.executable, env=forward,
                     heartbeat_timeout=sup.heartbeat_timeout, restartable=ps)
        groups.append(agent)
    sink = sink_for(out, len(plan.procs))
    if policy is None and ps:
        from trainrun.supervisor.ps_policy import PsPolicy

        policy = PsPolicy(plan.job.tf_tasks, sup.ps_restarts)
    return supervised(plan, sink, groups, sup, out, policy=policy)


def supervised(plan: LaunchPlan, sink: JobOutput, groups: list[RankGroup], sup: Supervision, out: OutputOptions,
               policy: ExitPolicy | None = None) -> Job:
    """The one Job constructor of every mode (a static job, an elastic attempt, --mpi openmpi's mpirun): the
    timeouts of `sup`, --output-dir, and --monitor/--json's live view when asked."""
    job = Job(plan, sink, groups, grace=sup.grace, start_timeout=sup.start_timeout, hang_timeout=sup.hang_timeout,
              output_dir=out.output_dir, policy=policy)
    if out.monitor or out.json:  # the live view / JSON events: their module only when asked (import rule)
        from trainrun.supervisor import monitor

        monitor.attach_to_job(job, out.monitor, out.json)
    return job


def check_shm_room(by_host: dict, facts: dict, remote: set[str]) -> None:
    """Raise TrainrunError (exit 3, as a host that cannot be set up) naming every host whose /dev/shm has less
    room than the MPI world of its ranks needs (mpiworld/shm.py), before any rank starts: short of it, MPICH's
    ranks die of SIGBUS at MPI_Init, which says nothing of why and would spend an elastic job's restarts (an
    error raised here ends the job, the loop's attempt never starts). A remote host's room is the one its agent
    reported in HELLO; this machine's is read now (an elastic job's facts of it are from its first attempt).
    Whether the program initializes MPI at all cannot be known, so the need is what MPICH takes at init (about
    1 MiB a rank), which a normal host has."""
    from trainrun.errors import HostError, TrainrunError
    from trainrun.mpiworld.shm import shm_free, shm_shortage

    short = []
    for host, procs in by_host.items():
        free = getattr(facts.get(host), "shm_free", None) if host in remote else shm_free()
        if (line := shm_shortage(host, free, len(procs))) is not None:
            short.append(line)
    if short:
        more = f" (and {len(short) - 1} more host(s): {'; '.join(short[1:])})" if len(short) > 1 else ""
        raise TrainrunError(short[0] + more, exit_code=HostError.exit_code)
