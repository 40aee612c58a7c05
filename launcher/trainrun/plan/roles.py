"""TensorFlow parameter-server roles (`--tf-cluster`): the counts asked for, and which rank plays which. Pure.

    parse_roles("chief=1,worker=4,ps=2")   RoleCounts (the CLI's type: argv and YAML are parsed here, once)
    RoleCounts.resolve(np)                 the counts for a job of np ranks (`worker` omitted: the rest)
    place_roles(counts, hosts_of_ranks)    (role, index) of every rank

Placement: rank 0 is the chief. Parameter servers are spread over the job's hosts, one per host per round,
starting with the host after the chief's (the chief's host is busy coordinating) and never more than
ceil(ps / hosts) on one host: with 3 hosts and 2 ps they are on two different hosts; with one host (a local
job) both are there. Each host gives its last ranks to its ps. The evaluator (at most one, as TensorFlow
allows) is the last rank left; every other rank is a worker, indexed in rank order.
"""
from __future__ import annotations

from dataclasses import dataclass

from trainrun.errors import UsageError

ROLES = ("chief", "worker", "ps", "evaluator")
FLAG = "--tf-cluster"


@dataclass(frozen=True)
class RoleCounts:
    """How many tasks of each role were asked for; `worker` None: the ranks left over."""

    ps: int
    chief: int = 1
    worker: int | None = None
    evaluator: int = 0

    @property
    def total(self) -> int | None:
        """Every task counted, when `worker` was given (the job's -np then)."""
        return None if self.worker is None else self.chief + self.worker + self.ps + self.evaluator

    def resolve(self, np: int) -> RoleCounts:
        """The counts for a job of `np` ranks. UsageError when they do not add up to -np."""
        fixed = self.chief + self.ps + self.evaluator
        if self.worker is None:
            if np - fixed < 1:
                raise UsageError(f"{FLAG} {self}: {fixed} chief/ps/evaluator task(s) leave no worker among -np {np}; "
                                 f"raise -np to at least {fixed + 1} or lower ps")
            return RoleCounts(self.ps, self.chief, np - fixed, self.evaluator)
        if self.total != np:
            raise UsageError(f"{FLAG} {self}: the roles add up to {self.total} tasks, not -np {np}; "
                             f"drop -np or make them agree")
        return self

    def __str__(self) -> str:
        parts = [f"chief={self.chief}"] + ([f"worker={self.worker}"] if self.worker is not None else [])
        return ",".join(parts + [f"ps={self.ps}"] + ([f"evaluator={self.evaluator}"] if self.evaluator else []))


def parse_roles(text: str) -> RoleCounts:
    """`chief=1,worker=4,ps=2,evaluator=1` (any order; chief defaults to 1, evaluator to 0, worker to the
    rest of -np; ps is required). UsageError naming the bad part."""
    counts: dict[str, int] = {}
    for part in str(text).replace(" ", "").split(","):
        role, sep, value = part.partition("=")
        if role not in ROLES or not sep:
            raise UsageError(f"{FLAG} {text}: '{part}' is not ROLE=N with ROLE one of {', '.join(ROLES)}")
        if role in counts:
            raise UsageError(f"{FLAG} {text}: {role} given twice")
        if not value.isdigit():
            raise UsageError(f"{FLAG} {text}: {role}={value}: expected a whole number")
        counts[role] = int(value)
    if counts.get("ps", 0) < 1:
        raise UsageError(f"{FLAG} {text}: a parameter-server cluster needs ps=N with N >= 1")
    if counts.get("chief", 1) != 1:
        raise UsageError(f"{FLAG} {text}: chief={counts['chief']}: the cluster has exactly one chief (rank 0)")
    if counts.get("evaluator", 0) > 1:
        raise UsageError(f"{FLAG} {text}: evaluator={counts['evaluator']}: TensorFlow allows at most one evaluator")
    if counts.get("worker") == 0:
        raise UsageError(f"{FLAG} {text}: worker=0: ParameterServerStrategy needs at least one worker")
    return RoleCounts(counts["ps"], 1, counts.get("worker"), counts.get("evaluator", 0))


@dataclass(frozen=True)
class Task:
    """One rank's place in the TensorFlow cluster."""

    role: str
    index: int


def place_roles(counts: RoleCounts, hosts: list[str]) -> tuple[Task, ...]:
    """The task of every rank, given each rank's host name in rank order (`counts` resolved for len(hosts)).
    UsageError when the parameter servers cannot be spread (see the module's rule)."""
    counts = counts.resolve(len(hosts))
    order: list[str] = []
    ranks_of: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        if host not in ranks_of:
            order.append(host)
            ranks_of[host] = []
        if rank:  # rank 0 is the chief
            ranks_of[host].append(rank)
    cap = -(-counts.ps // len(order))
    ps_ranks: list[int] = []
    for _ in range(cap):
        for host in order[1:] + order[:1]:
            if len(ps_ranks) < counts.ps and ranks_of[host]:
                ps_ranks.append(ranks_of[host].pop())
    if len(ps_ranks) < counts.ps:
        full = [h for h in order if not ranks_of[h]]
        raise UsageError(f"{FLAG} {counts}: {counts.ps} parameter servers cannot be spread over {len(order)} host(s), "
                         f"at most {cap} per host (no rank left for one on {', '.join(full)}); "
                         "add hosts or slots, or lower ps")
    tasks: list[Task | None] = [None] * len(hosts)
    tasks[0] = Task("chief", 0)
    for i, r in enumerate(sorted(ps_ranks)):
        tasks[r] = Task("ps", i)
    rest = [r for r in range(1, len(hosts)) if tasks[r] is None]
    if counts.evaluator:
        tasks[rest.pop()] = Task("evaluator", 0)
    for i, r in enumerate(rest):
        tasks[r] = Task("worker", i)
    return tuple(tasks)  # type: ignore[arg-type]


def cluster_of(tasks: tuple[Task, ...], addresses: tuple[str, ...]) -> dict[str, list[str]]:
    """TF_CONFIG's "cluster": every role's "address:port" list in task-index order (`addresses` per rank)."""
    out: dict[str, list[str]] = {}
    for task, address in sorted(zip(tasks, addresses), key=lambda ta: (ROLES.index(ta[0].role), ta[0].index)):
        out.setdefault(task.role, []).append(address)
    return out
