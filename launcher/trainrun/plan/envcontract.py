"""The per-rank environment contract (docs/architecture.md): RankAssignment -> env, and back for the runtime. Pure.

`rank_env` is everything trainrun adds to a rank's environment; `read_rank_env` is what the runtime
(`trainrun.torch` etc.) reads back. Host-side facts (OMP_NUM_THREADS from the host's cores, PMI_FD)
are added where the process starts (run/local.py), since only that host knows them.
"""
from __future__ import annotations

from dataclasses import dataclass

from trainrun.plan.coords import RankCoords
from trainrun.plan.placement import RankAssignment


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


def rank_env(a: RankAssignment, job: JobInfo) -> dict[str, str]:
    """The variables trainrun sets for rank `a` (all values are strings)."""
    env = {
        "RANK": a.rank,
        "WORLD_SIZE": a.size,
        "LOCAL_RANK": a.local_rank,
        "LOCAL_WORLD_SIZE": a.local_size,
        "NODE_RANK": a.node_rank,
        "NNODES": a.nnodes,
        "MASTER_ADDR": job.master_addr,
        "MASTER_PORT": job.master_port,
        "TRAINRUN_RANK": a.rank,
        "TRAINRUN_SIZE": a.size,
        "TRAINRUN_LOCAL_RANK": a.local_rank,
        "TRAINRUN_LOCAL_SIZE": a.local_size,
        "TRAINRUN_CROSS_RANK": a.cross_rank,
        "TRAINRUN_CROSS_SIZE": a.cross_size,
        "TRAINRUN_HOSTNAME": a.host.name,
        "TRAINRUN_JOB_ID": job.job_id,
    }
    if a.gpus:
        env["TRAINRUN_GPUS"] = ",".join(map(str, a.gpus))
        if job.isolate_gpus:
            env["CUDA_VISIBLE_DEVICES"] = env["TRAINRUN_GPUS"]
    if job.gpu_operations:
        env["TRAINRUN_GPU_OPERATIONS"] = job.gpu_operations
    if job.slurm:
        # Programs that read Slurm's variables (Lightning, submitit, hand-written srun scripts) see the same world
        # as the contract, not the one-task step an agent runs in or the launcher's allocation.
        env.update(SLURM_PROCID=a.rank, SLURM_LOCALID=a.local_rank, SLURM_NODEID=a.node_rank, SLURM_NTASKS=a.size,
                   SLURM_NPROCS=a.size)
    if job.tf_workers:
        env["TF_CONFIG"] = tf_config(job.tf_workers, a.rank)
    if job.nics:
        nics = ",".join(job.nics)
        env.update(NCCL_SOCKET_IFNAME=nics, GLOO_SOCKET_IFNAME=nics, UCX_NET_DEVICES=nics)
    return {k: str(v) for k, v in env.items()}


def tf_config(workers: tuple[str, ...], index: int) -> str:
    """TF_CONFIG (JSON) for worker `index` of `workers`: what tf.distribute.MultiWorkerMirroredStrategy reads.
    Written by hand, not with json: the launch path does not import it (addresses and ports need no escaping)."""
    listed = ", ".join(f'"{w}"' for w in workers)
    return f'{{"cluster": {{"worker": [{listed}]}}, "task": {{"type": "worker", "index": {index}}}}}'


# What a remote rank inherits from the launcher's environment (a local rank inherits all of it).
FORWARD_NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "LANG", "LC_ALL", "TZ")
FORWARD_PREFIXES = ("TRAINRUN_", "NCCL_", "UCX_", "FI_", "MPIR_CVAR_", "OMP_", "GLOO_", "TORCH_", "PYTORCH_", "HOROVOD_")


def forwarded_env(environ) -> dict[str, str]:
    """The part of the launcher's environment that remote ranks get (the README lists it)."""
    return {k: v for k, v in environ.items() if k in FORWARD_NAMES or k.startswith(FORWARD_PREFIXES)}


@dataclass(frozen=True)
class RankEnv(RankCoords):
    """What a rank learns from its environment (the runtime's view of the contract)."""

    hostname: str = ""
    job_id: str = ""
    gpus: tuple[int, ...] = ()


def read_rank_env(environ) -> RankEnv | None:
    """The contract as seen inside a rank, or None when the process was not started by trainrun."""
    if "TRAINRUN_RANK" not in environ:
        return None

    def get(key: str) -> int:
        return int(environ[f"TRAINRUN_{key}"])

    gpus = environ.get("TRAINRUN_GPUS", "")
    return RankEnv(
        rank=get("RANK"),
        size=get("SIZE"),
        local_rank=get("LOCAL_RANK"),
        local_size=get("LOCAL_SIZE"),
        cross_rank=get("CROSS_RANK"),
        cross_size=get("CROSS_SIZE"),
        hostname=environ.get("TRAINRUN_HOSTNAME", ""),
        job_id=environ.get("TRAINRUN_JOB_ID", ""),
        gpus=tuple(int(g) for g in gpus.split(",") if g),
    )
