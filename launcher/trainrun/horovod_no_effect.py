"""Horovod's HOROVOD_* variables that have no effect under trainrun, and why: the one list. Pure, stdlib only.

Both sides say it: rank 0's runtime when a rank's environment sets such a variable (runtime/horovod_env.py:
"trainrun: HOROVOD_X has no effect: why; instead"), and the `horovodrun` command when an option would set
one (horovodrun/translate.py: "--option has no effect: why; instead", the variable then not set, so the
note is said once). A name ending in `_` is a prefix (every HOROVOD_GLOO_* variable).

Each entry is a `NoEffect`: the reason, then what to do instead, worded for who reads it -- a variable's
user (`instead`) or a horovodrun option's user (`option_instead`, where horovodrun spells it otherwise).
The variables the runtime does read are runtime/horovod_env.READ; nothing is in both.
"""
from __future__ import annotations

from typing import NamedTuple


class NoEffect(NamedTuple):
    why: str                           # what trainrun lacks, or does anyway
    instead: str = ""                  # what to do instead, for a user who set the variable ("": nothing)
    option_instead: str | None = None  # the same for horovodrun's option (None: `instead`)

    def for_variable(self) -> str:
        return f"{self.why}; {self.instead}" if self.instead else self.why

    def for_option(self) -> str:
        instead = self.instead if self.option_instead is None else self.option_instead
        return f"{self.why}; {instead}" if instead else self.why


_BUILD_TIME = NoEffect("a build-time variable (Horovod's pip install); trainrun builds nothing")
_NO_CYCLE = "trainrun has no fixed cycle: ranks run a round as soon as an op is ready"
_PLACE = NoEffect("a rank's place comes from trainrun's contract (TRAINRUN_RANK, TRAINRUN_SIZE, ...)")

NO_EFFECT: dict[str, NoEffect] = {
    "HOROVOD_CYCLE_TIME": NoEffect(_NO_CYCLE),
    "HOROVOD_TIMELINE_MARK_CYCLES": NoEffect(_NO_CYCLE + " (no cycles to mark)"),
    "HOROVOD_HIERARCHICAL_ALLREDUCE": NoEffect("no two-level allreduce here; MPI's allreduce picks its own algorithm"),
    "HOROVOD_HIERARCHICAL_ALLGATHER": NoEffect("no two-level allgather here; MPI's allgather picks its own algorithm"),
    "HOROVOD_AUTOTUNE": NoEffect("no autotuner", "set HOROVOD_FUSION_THRESHOLD (or TRAINRUN_FUSION_THRESHOLD) yourself",
                                "set --fusion-threshold-mb yourself"),
    "HOROVOD_AUTOTUNE_": NoEffect("no autotuner"),
    "HOROVOD_NUM_NCCL_STREAMS": NoEffect("trainrun uses one NCCL stream per rank"),
    "HOROVOD_THREAD_AFFINITY": NoEffect("no background-thread pinning", "trainrun --bind-to core pins the ranks",
                                       "--binding-args='--bind-to core' pins the ranks"),
    "HOROVOD_MPI_THREADS_DISABLE": NoEffect("the runtime needs MPI_THREAD_SERIALIZED or more (mpi4py's default is MULTIPLE)"),
    "HOROVOD_BATCH_D2D_MEMCOPIES": NoEffect("CUDA tensors are packed by torch, not by batched kernels"),
    "HOROVOD_ADASUM_MPI_CHUNK_SIZE": NoEffect("Adasum runs on an allgather here, not in MPI chunks"),
    "HOROVOD_DISABLE_GROUP_FUSION": NoEffect("a group always runs as one fused op here"),
    "HOROVOD_DISABLE_NVTX_RANGES": NoEffect("trainrun emits no NVTX ranges"),
    "HOROVOD_ENABLE_XLA_OPS": NoEffect("no XLA ops; TensorFlow collectives run as py functions"),
    "HOROVOD_DYNAMIC_PROCESS_SETS": NoEffect("process sets can always be added after init here"),
    "HOROVOD_LOG_HIDE_TIME": NoEffect("runtime lines carry no time", "use trainrun --prefix timestamp",
                                     "--prefix-output-with-timestamp stamps every line"),
    "HOROVOD_GLOO_": NoEffect("no Gloo: ranks join one MPI world", "see trainrun --start-timeout", "see --start-timeout"),
    "HOROVOD_CCL_": NoEffect("no oneCCL in trainrun"),
    "HOROVOD_MLSL_": NoEffect("no MLSL in trainrun"),
    "HOROVOD_RANK": _PLACE, "HOROVOD_SIZE": _PLACE, "HOROVOD_LOCAL_RANK": _PLACE, "HOROVOD_LOCAL_SIZE": _PLACE,
    "HOROVOD_CROSS_RANK": _PLACE, "HOROVOD_CROSS_SIZE": _PLACE, "HOROVOD_HOSTNAME": _PLACE,
    "HOROVOD_WITH_": _BUILD_TIME, "HOROVOD_WITHOUT_": _BUILD_TIME, "HOROVOD_GPU_ALLREDUCE": _BUILD_TIME,
    "HOROVOD_GPU_ALLGATHER": _BUILD_TIME, "HOROVOD_GPU_BROADCAST": _BUILD_TIME, "HOROVOD_GPU_ALLTOALL": _BUILD_TIME,
    "HOROVOD_GPU_REDUCESCATTER": _BUILD_TIME, "HOROVOD_BUILD_": _BUILD_TIME, "HOROVOD_NCCL_": _BUILD_TIME,
    "HOROVOD_CUDA_": _BUILD_TIME, "HOROVOD_ROCM_": _BUILD_TIME, "HOROVOD_CMAKE": _BUILD_TIME,
    "HOROVOD_MPICXX_SHOW": _BUILD_TIME, "HOROVOD_DEBUG": _BUILD_TIME, "HOROVOD_GPU": _BUILD_TIME,
}


def verdict(name: str) -> NoEffect | None:
    """The verdict on HOROVOD_* variable `name` (its own entry, else a prefix's), None if it is not listed."""
    found = NO_EFFECT.get(name)
    if found is not None:
        return found
    return next((v for p, v in NO_EFFECT.items() if p.endswith("_") and name.startswith(p)), None)
