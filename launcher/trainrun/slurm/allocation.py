"""What a Slurm allocation's environment says about the job: Allocation.from_environ(os.environ).

Read inside `salloc`, an `sbatch` script or an `srun` step (SLURM_JOB_ID set); None outside one.

    job id        SLURM_JOB_ID (older: SLURM_JOBID)
    hosts         SLURM_JOB_NODELIST (older: SLURM_NODELIST), expanded, in Slurm's order
    slots         SLURM_TASKS_PER_NODE when set (salloc/sbatch set it, `1(x2)` even without -n), else
                  SLURM_JOB_CPUS_PER_NODE, else 1 per host; the list must have one count per host
    cpus          SLURM_JOB_CPUS_PER_NODE (None per host when unset)
    gpus          SLURM_GPUS_PER_NODE (`[type:]N`, same on every host) when set; else, for a one-host
                  allocation, that host's SLURM_GPUS_ON_NODE or the length of SLURM_JOB_GPUS (`0,1`); else
                  None: Slurm says nothing about the other hosts' GPUs outside a step
    ntasks        SLURM_NTASKS (older: SLURM_NPROCS) when set: `-np`'s default, else the sum of the slots

Inside an srun step the SLURM_STEP_* / SLURM_NODELIST variables describe the step; this reads the job's.
A malformed value raises SlurmEnvError: one line naming the variable, its value and what is wrong.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from trainrun.errors import UsageError
from trainrun.slurm.nodelist import expand_counts, expand_nodelist


class SlurmEnvError(UsageError, ValueError):
    """A Slurm variable of the environment is malformed; the message names it (exit code 2)."""


@dataclass(frozen=True)
class SlurmHost:
    """One host of the allocation: its node name, the tasks Slurm gives it, its CPUs and GPUs if known."""

    name: str
    slots: int
    cpus: int | None = None
    gpus: int | None = None


@dataclass(frozen=True)
class Allocation:
    """A Slurm job's allocation as its environment describes it (see the module docstring)."""

    job_id: str
    hosts: tuple[SlurmHost, ...]
    ntasks: int | None = None
    slots_from: str = "SLURM_TASKS_PER_NODE"   # the variable the slots came from ("" for 1 per host)

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    @property
    def slots(self) -> int:
        return sum(h.slots for h in self.hosts)

    @property
    def default_np(self) -> int:
        """The rank count when the user gives no -np: Slurm's task count, else every slot."""
        return self.ntasks if self.ntasks is not None else self.slots

    def describe(self) -> str:
        """One line for --dry-run: 'Slurm job 42: 3 hosts h1..h3, 6 slots (SLURM_TASKS_PER_NODE)'."""
        names = self.names
        shown = ", ".join(names) if len(names) <= 4 else f"{names[0]}..{names[-1]}"
        source = self.slots_from or "1 per host"
        return f"Slurm job {self.job_id}: {len(names)} hosts {shown}, {self.slots} slots ({source})"

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> Allocation | None:
        """The allocation `env` is inside, or None when no SLURM_JOB_ID (nor SLURM_JOBID) is set.
        Raises SlurmEnvError for a malformed or missing variable."""
        var, job_id = _first(env, "SLURM_JOB_ID", "SLURM_JOBID")
        if var is None:
            return None
        if not job_id.strip().isdigit():
            raise _error(var, job_id, "not a job id")
        var, nodelist = _first(env, "SLURM_JOB_NODELIST", "SLURM_NODELIST")
        if var is None:
            raise SlurmEnvError(f"SLURM_JOB_ID={job_id} is set but SLURM_JOB_NODELIST is not: "
                                "run inside salloc/sbatch, or unset SLURM_JOB_ID to use -H/--hostfile")
        names = _parse(var, nodelist, expand_nodelist)
        cpus = _counts(env, "SLURM_JOB_CPUS_PER_NODE", len(names))
        slots_from, slots = "SLURM_TASKS_PER_NODE", _counts(env, "SLURM_TASKS_PER_NODE", len(names))
        if slots is None:
            slots_from, slots = ("SLURM_JOB_CPUS_PER_NODE", cpus) if cpus is not None else ("", [1] * len(names))
        gpus = _gpus(env, len(names))
        hosts = tuple(SlurmHost(n, s, c, gpus) for n, s, c in
                      zip(names, slots, cpus if cpus is not None else [None] * len(names)))
        return cls(job_id.strip(), hosts, _ntasks(env), slots_from)


def _first(env: Mapping[str, str], *names: str) -> tuple[str | None, str]:
    for name in names:
        if name in env:
            return name, env[name]
    return None, ""


T = TypeVar("T")


def _error(var: str, value: str, what: str) -> SlurmEnvError:
    return SlurmEnvError(f"{var}={value!r}: {what}; unset SLURM_JOB_ID to launch without the allocation")


def _parse(var: str, value: str, parse: Callable[[str], T]) -> T:
    try:
        return parse(value)
    except ValueError as e:
        raise _error(var, value, str(e)) from None


def _counts(env: Mapping[str, str], var: str, hosts: int) -> list[int] | None:
    if var not in env:
        return None
    counts = _parse(var, env[var], expand_counts)
    if len(counts) != hosts:
        raise _error(var, env[var], f"{len(counts)} counts for {hosts} hosts")
    if var == "SLURM_TASKS_PER_NODE" and 0 in counts:
        raise _error(var, env[var], "a host with no task")
    return counts


def _ntasks(env: Mapping[str, str]) -> int | None:
    var, value = _first(env, "SLURM_NTASKS", "SLURM_NPROCS")
    if var is None:
        return None
    if not value.strip().isdigit() or int(value) < 1:
        raise _error(var, value, "not a positive task count")
    return int(value)


def _gpu_count(spec: str) -> int:
    """`2`, `a100:2`, `gpu:a100:2` or a comma list of them (types summed) -> the GPU count."""
    total = 0
    for part in spec.split(","):
        count = part.strip().rsplit(":", 1)[-1]
        if not count.isdigit():
            raise ValueError(f"bad GPU count {part.strip()!r}: expected [type:]N")
        total += int(count)
    return total


def _gpu_ids(spec: str) -> int:
    """`0,1,3` (or with ranges `0-3`) -> how many GPU indices it lists; '' is none."""
    if not spec.strip():
        return 0
    n = 0
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and (not hi.isdigit() or int(hi) < int(lo))):
            raise ValueError(f"bad GPU index {part.strip()!r}: expected N or N-M")
        n += int(hi) - int(lo) + 1 if hi else 1
    return n


def _gpus(env: Mapping[str, str], hosts: int) -> int | None:
    if "SLURM_GPUS_PER_NODE" in env:
        return _parse("SLURM_GPUS_PER_NODE", env["SLURM_GPUS_PER_NODE"], _gpu_count)
    if hosts != 1:
        return None
    if "SLURM_GPUS_ON_NODE" in env:
        value = env["SLURM_GPUS_ON_NODE"]
        if not value.strip().isdigit():
            raise _error("SLURM_GPUS_ON_NODE", value, "not a GPU count")
        return int(value)
    if "SLURM_JOB_GPUS" in env:
        return _parse("SLURM_JOB_GPUS", env["SLURM_JOB_GPUS"], _gpu_ids)
    return None
