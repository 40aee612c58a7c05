"""The per-rank environment contract (docs/architecture.md): RankAssignment -> env. Pure.

`rank_env` is everything trainrun adds to a rank's environment (a plan holds it as a RankEnvMap: the job's
shared JobEnv plus the rank's numbers, built when read, so planning stays linear in the ranks); the
runtime checks its coordinates against the MPI world (runtime/topology.check_env). Host-side facts
(OMP_NUM_THREADS from the host's cores, PMI_FD) are added where the process starts (supervisor/local.py), since only that host knows them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

from trainrun.plan.placement import RankAssignment
from trainrun.plan.roles import Task, cluster_of


@dataclass(frozen=True)
class JobInfo:
    """Job-wide facts that every rank's env carries."""

    job_id: str
    master_addr: str
    master_port: int
    nics: tuple[str, ...] = ()
    isolate_gpus: bool = False
    slurm: bool = False  # inside a Slurm allocation: also Slurm's own rank variables (see rank_env)
    tf_workers: tuple[str, ...] = ()  # "address:port" per rank: TF_CONFIG for tf.distribute's multi-worker strategies
    gpu_operations: str = ""  # TRAINRUN_GPU_OPERATIONS for every rank ("mpi" when --allow-gpu-sharing shares GPUs)
    tf_tasks: tuple[Task, ...] = ()  # --tf-cluster: every rank's role and index (TF_CONFIG lists them by role)

    def task_of(self, rank: int) -> Task:
        """Rank's task in TF_CONFIG: its --tf-cluster role, else worker `rank` (MultiWorkerMirroredStrategy)."""
        return self.tf_tasks[rank] if self.tf_tasks else Task("worker", rank)

    def to_arg(self) -> str:
        """One command-line word (JSON) that from_arg reads back (the Open MPI rank shim gets it)."""
        import json

        return json.dumps([self.job_id, self.master_addr, self.master_port, list(self.nics), self.isolate_gpus,
                           self.slurm, self.gpu_operations], separators=(",", ":"))

    @classmethod
    def from_arg(cls, text: str) -> JobInfo:
        import json

        job_id, addr, port, nics, isolate, slurm, gpu_operations = json.loads(text)
        return cls(job_id, addr, int(port), tuple(nics), bool(isolate), bool(slurm), gpu_operations=gpu_operations)


@dataclass(frozen=True)
class JobEnv:
    """What every rank's environment shares, built once per plan: the job-wide variables, the user's -x
    exports (they win over anything derived, e.g. the NIC choice) and TF_CONFIG's worker list as one JSON
    prefix. Sharing it keeps a plan linear in its ranks: each rank's env is a RankEnvMap over it."""

    job: JobInfo
    common: dict[str, str]
    exported: dict[str, str]
    tf_prefix: str = ""  # TF_CONFIG up to its task ('{"cluster": {...}, "task": '); "" without tf_workers


def job_env(job: JobInfo, size: int, nnodes: int, exported: dict[str, str] | None = None) -> JobEnv:
    """The shared part of every rank's env for a job of `size` ranks on `nnodes` hosts."""
    common = {"WORLD_SIZE": size, "NNODES": nnodes, "MASTER_ADDR": job.master_addr, "MASTER_PORT": job.master_port,
              "TRAINRUN_SIZE": size, "TRAINRUN_JOB_ID": job.job_id}
    if job.gpu_operations:
        common["TRAINRUN_GPU_OPERATIONS"] = job.gpu_operations
    if job.slurm:
        # Programs that read Slurm's variables (Lightning, submitit, hand-written srun scripts) see the same world
        # as the contract, not the one-task step an agent runs in or the launcher's allocation.
        common.update(SLURM_NTASKS=size, SLURM_NPROCS=size)
    if job.nics:
        nics = ",".join(job.nics)
        common.update(NCCL_SOCKET_IFNAME=nics, GLOO_SOCKET_IFNAME=nics, UCX_NET_DEVICES=nics)
    prefix = ""
    if job.tf_workers:  # the cluster is written once per job; each rank adds its task (tf_task)
        cluster = cluster_of(job.tf_tasks, job.tf_workers) if job.tf_tasks else {"worker": job.tf_workers}
        prefix = _cluster_prefix(cluster)
    return JobEnv(job, {k: str(v) for k, v in common.items()}, dict(exported or {}), prefix)


# Each rank's own variables: name -> (whether the rank has it, its value). Looked up one name at a time.
_PER_RANK: dict[str, tuple[Callable[[RankAssignment, JobEnv], bool] | None, Callable[[RankAssignment], object]]] = {
    "RANK": (None, lambda a: a.rank),
    "LOCAL_RANK": (None, lambda a: a.local_rank),
    "LOCAL_WORLD_SIZE": (None, lambda a: a.local_size),
    "NODE_RANK": (None, lambda a: a.node_rank),
    "TRAINRUN_RANK": (None, lambda a: a.rank),
    "TRAINRUN_LOCAL_RANK": (None, lambda a: a.local_rank),
    "TRAINRUN_LOCAL_SIZE": (None, lambda a: a.local_size),
    "TRAINRUN_CROSS_RANK": (None, lambda a: a.cross_rank),
    "TRAINRUN_CROSS_SIZE": (None, lambda a: a.cross_size),
    "TRAINRUN_HOSTNAME": (None, lambda a: a.host.name),
    "TRAINRUN_GPUS": (lambda a, s: bool(a.gpus), lambda a: ",".join(map(str, a.gpus))),
    "CUDA_VISIBLE_DEVICES": (lambda a, s: bool(a.gpus) and s.job.isolate_gpus, lambda a: ",".join(map(str, a.gpus))),
    "SLURM_PROCID": (lambda a, s: s.job.slurm, lambda a: a.rank),
    "SLURM_LOCALID": (lambda a, s: s.job.slurm, lambda a: a.local_rank),
    "SLURM_NODEID": (lambda a, s: s.job.slurm, lambda a: a.node_rank),
}


def _cluster_prefix(cluster: Mapping[str, tuple[str, ...] | list[str]]) -> str:
    """TF_CONFIG up to its task. Written by hand, not with json: the launch path does not import it
    (roles, addresses and ports need no escaping)."""
    jobs = ", ".join(f'"{role}": [' + ", ".join(f'"{a}"' for a in addrs) + "]" for role, addrs in cluster.items())
    return f'{{"cluster": {{{jobs}}}, "task": '


def tf_task(task: Task) -> str:
    """The rest of TF_CONFIG after _cluster_prefix: this rank's task, and the document closed."""
    return f'{{"type": "{task.role}", "index": {task.index}}}}}'


_ROLE_KEYS = ("TRAINRUN_ROLE", "TRAINRUN_ROLE_INDEX")  # --tf-cluster: for programs that do not read TF_CONFIG


class RankEnvMap(Mapping[str, str]):
    """The variables trainrun sets for one rank, built when read (when the rank starts, or a plan is printed),
    never stored: the shared JobEnv plus this rank's numbers. A plan of N ranks holds N of these small objects,
    not N copies of a TF_CONFIG that lists N workers."""

    __slots__ = ("assignment", "shared")

    def __init__(self, assignment: RankAssignment, shared: JobEnv):
        self.assignment, self.shared = assignment, shared

    def _has(self, key: str) -> bool:
        entry = _PER_RANK.get(key)
        return entry is not None and (entry[0] is None or entry[0](self.assignment, self.shared))

    def __getitem__(self, key: str) -> str:
        s = self.shared
        if key in s.exported:
            return s.exported[key]
        if key in s.common:
            return s.common[key]
        if key == "TF_CONFIG" and s.tf_prefix:
            return s.tf_prefix + tf_task(s.job.task_of(self.assignment.rank))
        if key in _ROLE_KEYS and s.job.tf_tasks:
            task = s.job.tf_tasks[self.assignment.rank]
            return task.role if key == "TRAINRUN_ROLE" else str(task.index)
        if self._has(key):
            return str(_PER_RANK[key][1](self.assignment))
        raise KeyError(key)

    def _keys(self) -> list[str]:
        s = self.shared
        own = [k for k in _PER_RANK if self._has(k)] + (["TF_CONFIG"] if s.tf_prefix else [])
        own += list(_ROLE_KEYS) if s.job.tf_tasks else []
        return [*(k for k in own if k not in s.exported), *s.common.keys() - s.exported.keys(), *s.exported]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def __contains__(self, key: object) -> bool:
        s = self.shared
        if not isinstance(key, str):
            return False
        return (key in s.exported or key in s.common or (key == "TF_CONFIG" and bool(s.tf_prefix)) or self._has(key)
                or (key in _ROLE_KEYS and bool(s.job.tf_tasks)))

    def __repr__(self) -> str:
        return f"RankEnvMap(rank {self.assignment.rank})"


def rank_env(a: RankAssignment, job: JobInfo) -> dict[str, str]:
    """The variables trainrun sets for rank `a` (all values are strings), as one dict."""
    return dict(RankEnvMap(a, job_env(job, a.size, a.nnodes)))


# What a remote rank inherits from the launcher's environment (a local rank inherits all of it).
FORWARD_NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "LANG", "LC_ALL", "TZ")
FORWARD_PREFIXES = ("TRAINRUN_", "NCCL_", "UCX_", "FI_", "MPIR_CVAR_", "OMP_", "GLOO_", "TORCH_", "PYTORCH_", "HOROVOD_")


def forwarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of the launcher's environment that remote ranks get (docs/reference/environment.md lists it)."""
    return {k: v for k, v in environ.items() if k in FORWARD_NAMES or k.startswith(FORWARD_PREFIXES)}
