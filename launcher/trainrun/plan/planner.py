"""The one planning path that every mode shares (a launch, each elastic attempt, `--mpi openmpi`, `--dry-run`,
`--check`, `--tf-cluster`). Pure.

    PlanOptions                         what planning reads of the options (resolved once by the launch step)
    shape_job(opts, hosts)              hosts and how many ranks each gets (-np decided here, once)
    assign(opts, shape, facts)          every rank's RankAssignment, GPUs from each host's facts
    make_plan(opts, shape, facts, ...)  the LaunchPlan: argv, env contract, cwd per rank
    plan_job(opts, shape, facts, routes, nics)  make_plan with the addresses by the one rule below
    master_address(...)                 MASTER_ADDR: the address rank 0's host is reached at by every host
    host_addresses(...)                 every host's address by the same rule (TF_CONFIG's workers and ps)
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Literal, Mapping, NamedTuple

from trainrun.plan.facts import NO_FACTS, HostFacts
from trainrun.plan.envcontract import JobInfo
from trainrun.plan.hosts import Exclusion, HostSpec
from trainrun.plan.placement import RankAssignment, assign_ranks, ranks_per_host, shares_gpus
from trainrun.plan.program import command_argv
from trainrun.plan.roles import RoleCounts, place_roles
from trainrun.plan.spec import LaunchPlan, build_plan


class PlanOptions(NamedTuple):  # the launch specs are NamedTuples, not frozen dataclasses: every launch defines
    # them, and a NamedTuple costs ~0.07 ms to define against ~0.4 ms (scripts/bench_launch.py)
    """What planning reads of the launch options, resolved once by the launch step (launchspec.resolve): the
    program's words, -np, --tf-cluster, --oversubscribe, --exclude (its GPUs), --gpus-per-proc,
    --allow-gpu-sharing, --python, --workdir, --bind-to, `exports` (-x's variables with their values and
    TRAINRUN_HOROVOD: config.LaunchConfig.exported_env, run once) and --mpi."""

    command: tuple[str, ...]
    num_proc: int | None = None
    tf_cluster: RoleCounts | None = None
    oversubscribe: bool = False
    exclude: Exclusion = Exclusion()
    gpus_per_proc: int | None = None
    allow_gpu_sharing: bool = False
    python: str | None = None
    workdir: str | None = None
    bind_to: Literal["none", "core"] = "none"
    exports: tuple[tuple[str, str], ...] = ()
    mpi: str = "mpich"


@dataclass(frozen=True)
class JobShape:
    """The hosts as given, and how many ranks each gets (0: not part of the job)."""

    hosts: tuple[HostSpec, ...]
    counts: tuple[int, ...]

    @property
    def np(self) -> int:
        return sum(self.counts)

    @property
    def used(self) -> list[HostSpec]:
        """The hosts that get ranks, in order (rank 0's first)."""
        return [h for h, c in zip(self.hosts, self.counts) if c]

    @property
    def remote(self) -> list[HostSpec]:
        return [h for h in self.used if not h.is_local]

    @property
    def has_local(self) -> bool:
        return any(h.is_local for h in self.used)


def requested_np(opts: PlanOptions, hosts: list[HostSpec], default_np: int | None = None) -> int:
    """-np, else the host source's default (a Slurm allocation's task count), else every slot of the hosts."""
    if opts.num_proc is not None:
        return opts.num_proc
    roles = opts.tf_cluster
    if roles is not None and roles.total is not None:  # --tf-cluster with every role counted: that many tasks
        return roles.total
    return default_np if default_np is not None else sum(h.slots for h in hosts)


def shape_job(opts: PlanOptions, hosts: list[HostSpec], default_np: int | None = None) -> JobShape:
    """Raises UsageError when -np does not fit the slots (without --oversubscribe)."""
    return JobShape(tuple(hosts), tuple(ranks_per_host(hosts, requested_np(opts, hosts, default_np), opts.oversubscribe)))


def assign(opts: PlanOptions, shape: JobShape, facts: Mapping[str, HostFacts]) -> list[RankAssignment]:
    """Every rank's place; hosts without facts (a dry run's remote hosts) get no GPUs, and GPUs that --exclude
    names (`host:gpu`) are left out of their host's pool. Raises UsageError
    when --gpus-per-proc asks a host for more GPUs than it has (without --allow-gpu-sharing)."""
    excl = opts.exclude
    pools = {h.name: tuple(g for g in facts.get(h.name, NO_FACTS).gpus if g not in excl.gpus_of(h.name)) for h in shape.hosts}
    return assign_ranks(list(shape.hosts), shape.np, oversubscribe=opts.oversubscribe, gpu_pools=pools,
                        gpus_per_proc=opts.gpus_per_proc or 1, allow_gpu_sharing=opts.allow_gpu_sharing,
                        isolate_gpus=opts.gpus_per_proc is not None)


def make_plan(opts: PlanOptions, shape: JobShape, facts: Mapping[str, HostFacts], master_addr: str, nics: tuple[str, ...] = (),
              job_id: str | None = None, environ: Mapping[str, str] | None = None, slurm: bool = False,
              addresses: Mapping[str, str] | None = None) -> LaunchPlan:
    """The whole job, decided. MASTER_PORT is the free port rank 0's host reported (29500 without facts).
    `addresses`: every used host's address that all hosts reach (for TF_CONFIG; default: rank 0's host at
    `master_addr`, the others by name)."""
    environ = os.environ if environ is None else environ
    rank0 = facts.get(shape.used[0].name, NO_FACTS)
    assignments = assign(opts, shape, facts)
    addresses = addresses or {h.name: master_addr if i == 0 else h.name for i, h in enumerate(shape.used)}
    roles = opts.tf_cluster
    tasks = place_roles(roles, [a.host.name for a in assignments]) if roles is not None else ()
    job = JobInfo(job_id=job_id or os.urandom(6).hex(), master_addr=master_addr, master_port=rank0.free_port,
                  nics=nics, isolate_gpus=opts.gpus_per_proc is not None, slurm=slurm,
                  tf_workers=tf_workers(assignments, facts, addresses),
                  gpu_operations=gpu_operations(opts, assignments, environ), tf_tasks=tasks)
    argv = command_argv(opts.command, opts.python or sys.executable)
    return build_plan(assignments, job, argv, opts.workdir or os.getcwd(), dict(opts.exports), opts.bind_to)


def plan_job(opts: PlanOptions, shape: JobShape, facts: Mapping[str, HostFacts], routes: Mapping[str, tuple[str, str]],
             nics: tuple[str, ...] = (), *, slurm: bool = False, job_id: str | None = None,
             environ: Mapping[str, str] | None = None) -> LaunchPlan:
    """make_plan with MASTER_ADDR and every host's address (TF_CONFIG) by host_address's one rule: what every
    mode plans with (a launch and each elastic attempt with the routes its agents took, --dry-run and --mpi
    openmpi with named_routes)."""
    addresses = host_addresses(shape, facts, routes, nics)
    return make_plan(opts, shape, facts, addresses[shape.used[0].name], nics, job_id=job_id, environ=environ,
                     slurm=slurm, addresses=addresses)


def gpu_operations(opts: PlanOptions, assignments: list[RankAssignment], environ: Mapping[str, str]) -> str:
    """"mpi" when --allow-gpu-sharing put two ranks on one GPU (NCCL refuses that; the MPI path stages CUDA
    tensors through host memory), unless the user chose with TRAINRUN_/HOROVOD_GPU_OPERATIONS; else ""."""
    chosen = "TRAINRUN_GPU_OPERATIONS" in environ or "HOROVOD_GPU_OPERATIONS" in environ
    return "mpi" if opts.allow_gpu_sharing and not chosen and shares_gpus(assignments) else ""


def tf_workers(assignments: list[RankAssignment], facts: Mapping[str, HostFacts], addresses: Mapping[str, str]) -> tuple[str, ...]:
    """"address:port" of every rank as a TF worker, on the host's address in `addresses`: the ports its host
    reported free, one per rank in order (the next numbers up past those). Host entries that are one machine
    (the same facts: `-H localhost:1,127.0.0.1:1`) draw from one list, so no two workers share a port."""
    out: list[str] = []
    taken: dict[int, int] = {}
    for a in assignments:
        f = facts.get(a.host.name, NO_FACTS)
        ports = f.worker_ports or (f.free_port + 1,)
        i = taken[id(f)] = taken.get(id(f), -1) + 1
        port = ports[i] if i < len(ports) else ports[-1] + i - len(ports) + 1
        out.append(f"{addresses[a.host.name]}:{port}")
    return tuple(out)


def master_address(rank0: HostSpec, facts: Mapping[str, HostFacts], routes: Mapping[str, tuple[str, str]],
                   nics: tuple[str, ...] = ()) -> str:
    """MASTER_ADDR: an address of rank 0's host that every host can reach: its address on the first chosen NIC,
    loopback for a one-machine job, the address the launcher reached rank 0's host at, or this machine's
    address on the route to the others. `routes`: {remote host: (its address, this machine's address) as
    reached}, or as a mode that reaches no host knows them (`named_routes`). Every mode asks this function."""
    return host_address(rank0, facts, routes, nics)


def named_routes(hosts: list[HostSpec], here: str) -> dict[str, tuple[str, str]]:
    """The routes of a job whose remote hosts are not reached by the launcher (`--dry-run`, `--mpi openmpi`,
    `--check`'s facts channels): each remote host by its name (what the launcher would reach it at), this
    machine by `here` (its name). What master_address and host_address take as `routes` there."""
    return {h.name: (h.name, here) for h in hosts if not h.is_local}


def host_addresses(shape: JobShape, facts: Mapping[str, HostFacts], routes: Mapping[str, tuple[str, str]],
                   nics: tuple[str, ...] = ()) -> dict[str, str]:
    """Every used host's address (TF_CONFIG's workers and ps, `--check --tf-cluster`'s targets): host_address."""
    return {h.name: host_address(h, facts, routes, nics) for h in shape.used}


def host_address(host: HostSpec, facts: Mapping[str, HostFacts], routes: Mapping[str, tuple[str, str]],
                 nics: tuple[str, ...] = ()) -> str:
    """master_address's rule for any host of the job (this machine's ranks included)."""
    if host.name in routes:
        addr = facts[host.name].address_on(nics[0]) if nics and host.name in facts else None
        return addr or routes[host.name][0]
    if routes:
        return next(iter(routes.values()))[1]
    return "127.0.0.1"
