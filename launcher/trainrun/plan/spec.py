"""LaunchPlan: every process of the job, fully decided before anything starts. Pure.

A plan is what `--dry-run` prints (render.py) and what rank groups run: one ProcessSpec per rank with
its host, argv, the env trainrun adds, its working directory and CPU binding policy. ProcessSpecs
travel to agents as JSON (spec_to_dict / spec_from_dict).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from trainrun.plan.envcontract import JobEnv, JobInfo, RankEnvMap, job_env
from trainrun.plan.hosts import HostSpec
from trainrun.plan.placement import RankAssignment


@dataclass(frozen=True)
class ProcessSpec:
    """One rank as planned: where it runs, its argv, what trainrun adds to its environment, its directory."""

    assignment: RankAssignment
    argv: tuple[str, ...]
    env: Mapping[str, str]  # what trainrun adds on top of the host's environment (in a plan: a RankEnvMap)
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
    """The whole job as planned: its JobInfo and one ProcessSpec per rank."""

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
    """One ProcessSpec per assignment. Linear in the ranks: what they share (argv, the job's env, the -x exports
    `extra_env`, which win over what trainrun derives, e.g. the NIC choice) is built once, and each rank's env
    is a RankEnvMap over it, built when read."""
    if not assignments:
        return LaunchPlan(job, ())
    shared = job_env(job, assignments[0].size, assignments[0].nnodes, extra_env)
    return LaunchPlan(job, tuple(ProcessSpec(a, argv, RankEnvMap(a, shared), cwd, bind_to) for a in assignments))


def with_env(plan: LaunchPlan, extra: dict[str, str]) -> LaunchPlan:
    """`plan` with `extra` in every rank's env, winning over the rest (as -x exports do). Linear in the ranks:
    `extra` joins the shared JobEnv once and each rank gets a new RankEnvMap over it, so no rank's env (a
    TF_CONFIG listing every worker) is built here; an env that is already a plain dict is copied."""
    shared: dict[int, JobEnv] = {}

    def env_of(env: Mapping[str, str]) -> Mapping[str, str]:
        if not isinstance(env, RankEnvMap):
            return {**env, **extra}
        if id(env.shared) not in shared:
            shared[id(env.shared)] = replace(env.shared, exported={**env.shared.exported, **extra})
        return RankEnvMap(env.assignment, shared[id(env.shared)])

    return LaunchPlan(plan.job, tuple(replace(p, env=env_of(p.env)) for p in plan.procs))


def spec_to_dict(p: ProcessSpec) -> dict[str, Any]:
    """A ProcessSpec as JSON-able data, for the agent that runs it on its host."""
    a = p.assignment
    return {
        "argv": list(p.argv), "env": dict(p.env), "cwd": p.cwd, "bind_to": p.bind_to,
        "host": {"name": a.host.name, "slots": a.host.slots, "user": a.host.user},
        "assignment": {k: getattr(a, k) for k in (
            "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size", "node_rank", "nnodes")},
        "gpus": list(a.gpus),
    }


def spec_from_dict(d: dict[str, Any]) -> ProcessSpec:
    host = HostSpec(**d["host"])
    a = RankAssignment(host=host, gpus=tuple(d["gpus"]), **d["assignment"])
    return ProcessSpec(a, tuple(d["argv"]), dict(d["env"]), d["cwd"], d["bind_to"])
