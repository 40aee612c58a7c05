"""The runtime's settings from the environment: trainrun's TRAINRUN_* names and Horovod's HOROVOD_* ones. Pure.

`read(environ)` returns one `Settings`. Each setting has a TRAINRUN_* name and the HOROVOD_* name(s) Horovod
users already set; TRAINRUN_* wins when both are set (the HOROVOD_* one is then noted as having no effect).

    setting           TRAINRUN_*                  HOROVOD_*                                default
    fusion_threshold  TRAINRUN_FUSION_THRESHOLD   HOROVOD_FUSION_THRESHOLD (bytes; 0: no fusion)   64 MiB
    cache_capacity    TRAINRUN_CACHE_CAPACITY     HOROVOD_CACHE_CAPACITY (0: no response cache)     4096
    stall_timeout     TRAINRUN_STALL_TIMEOUT      HOROVOD_STALL_SHUTDOWN_TIME_SECONDS when > 0, else
                                                  HOROVOD_STALL_CHECK_TIME_SECONDS; inf with
                                                  HOROVOD_STALL_CHECK_DISABLE=1                     60 s
    timeline_path     TRAINRUN_TIMELINE           HOROVOD_TIMELINE (a file path)                    none
    log_level         TRAINRUN_LOG_LEVEL          HOROVOD_LOG_LEVEL                                 warning
    bucket_bytes      TRAINRUN_BUCKET_BYTES       (none: torch DistributedOptimizer's gradient       25 MiB
                                                  buckets, torch/buckets.py; 0: one allreduce per gradient)

A stall is one error here (StallError on every rank that waits), where Horovod warns at the check time
and shuts down at the shutdown time only if that is set: so the error comes at the shutdown time when the
user asked for one, else at the check time. HOROVOD_GPU_OPERATIONS (nccl|mpi) is read where CUDA tensors
are reduced (backends/nccl.py); HOROVOD_CPU_OPERATIONS=mpi and HOROVOD_CONTROLLER=mpi are what trainrun
does anyway; HOROVOD_ELASTIC=1 matches an elastic launch (TRAINRUN_ELASTIC).

Every other HOROVOD_* variable, and a value the runtime cannot honour, becomes one line in `notes`
(`trainrun: HOROVOD_X has no effect: why`), which rank 0 prints once at init unless the log level is
error or fatal. At trace/debug/info rank 0 also prints the settings the engine runs with.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from trainrun.runtime.cache import CAPACITY as CACHE_CAPACITY

FUSION_THRESHOLD = 64 * 1024 * 1024
BUCKET_BYTES = 25 << 20  # torch DDP's bucket size: a large model still overlaps reduction with backward
STALL_TIMEOUT = 60.0
LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "fatal")

_TRUE = ("1", "true", "yes", "on")
_BUILD_TIME = "a build-time variable (Horovod's pip install); trainrun builds nothing"
_NO_CYCLE = "trainrun has no fixed cycle: ranks run a round as soon as an op is ready"
_PLACE = "a rank's place comes from trainrun's contract (TRAINRUN_RANK, TRAINRUN_SIZE, ...)"

# HOROVOD_* names (or prefixes, ending in _) that the runtime does not act on, and why.
NO_EFFECT = {
    "HOROVOD_CYCLE_TIME": _NO_CYCLE,
    "HOROVOD_TIMELINE_MARK_CYCLES": _NO_CYCLE + " (no cycles to mark)",
    "HOROVOD_HIERARCHICAL_ALLREDUCE": "no two-level allreduce here; MPI's allreduce picks its own algorithm",
    "HOROVOD_HIERARCHICAL_ALLGATHER": "no two-level allgather here; MPI's allgather picks its own algorithm",
    "HOROVOD_AUTOTUNE": "no autotuner; set HOROVOD_FUSION_THRESHOLD (or TRAINRUN_FUSION_THRESHOLD) yourself",
    "HOROVOD_AUTOTUNE_": "no autotuner",
    "HOROVOD_NUM_NCCL_STREAMS": "trainrun uses one NCCL stream per rank",
    "HOROVOD_THREAD_AFFINITY": "pin ranks with trainrun --bind-to core",
    "HOROVOD_MPI_THREADS_DISABLE": "the runtime needs MPI_THREAD_SERIALIZED or more (mpi4py's default is MULTIPLE)",
    "HOROVOD_BATCH_D2D_MEMCOPIES": "CUDA tensors are packed by torch, not by batched kernels",
    "HOROVOD_ADASUM_MPI_CHUNK_SIZE": "Adasum runs on an allgather here, not in MPI chunks",
    "HOROVOD_DISABLE_GROUP_FUSION": "a group always runs as one fused op here",
    "HOROVOD_DISABLE_NVTX_RANGES": "trainrun emits no NVTX ranges",
    "HOROVOD_ENABLE_XLA_OPS": "no XLA ops; TensorFlow collectives run as py functions",
    "HOROVOD_DYNAMIC_PROCESS_SETS": "process sets can always be added after init here",
    "HOROVOD_LOG_HIDE_TIME": "runtime lines carry no time; use trainrun --prefix timestamp",
    "HOROVOD_GLOO_": "no Gloo: ranks join one MPI world (see trainrun --start-timeout)",
    "HOROVOD_CCL_": "no oneCCL in trainrun",
    "HOROVOD_MLSL_": "no MLSL in trainrun",
    "HOROVOD_RANK": _PLACE, "HOROVOD_SIZE": _PLACE, "HOROVOD_LOCAL_RANK": _PLACE, "HOROVOD_LOCAL_SIZE": _PLACE,
    "HOROVOD_CROSS_RANK": _PLACE, "HOROVOD_CROSS_SIZE": _PLACE, "HOROVOD_HOSTNAME": _PLACE,
    "HOROVOD_WITH_": _BUILD_TIME, "HOROVOD_WITHOUT_": _BUILD_TIME, "HOROVOD_GPU_ALLREDUCE": _BUILD_TIME,
    "HOROVOD_GPU_ALLGATHER": _BUILD_TIME, "HOROVOD_GPU_BROADCAST": _BUILD_TIME, "HOROVOD_GPU_ALLTOALL": _BUILD_TIME,
    "HOROVOD_GPU_REDUCESCATTER": _BUILD_TIME, "HOROVOD_BUILD_": _BUILD_TIME, "HOROVOD_NCCL_": _BUILD_TIME,
    "HOROVOD_CUDA_": _BUILD_TIME, "HOROVOD_ROCM_": _BUILD_TIME, "HOROVOD_CMAKE": _BUILD_TIME,
    "HOROVOD_MPICXX_SHOW": _BUILD_TIME, "HOROVOD_DEBUG": _BUILD_TIME, "HOROVOD_GPU": _BUILD_TIME,
}
# Read here or elsewhere in trainrun: never reported as unknown.
READ = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CACHE_CAPACITY", "HOROVOD_STALL_CHECK_DISABLE",
        "HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_TIMELINE",
        "HOROVOD_LOG_LEVEL", "HOROVOD_GPU_OPERATIONS", "HOROVOD_CPU_OPERATIONS", "HOROVOD_CONTROLLER",
        "HOROVOD_ELASTIC")


@dataclass(frozen=True)
class Settings:
    """What the runtime runs with; `notes`: lines for rank 0's log (HOROVOD_* variables with no effect)."""

    fusion_threshold: int = FUSION_THRESHOLD   # bytes
    stall_timeout: float = STALL_TIMEOUT       # seconds; math.inf: never a StallError
    timeline_path: str | None = None           # a Chrome trace written at shutdown (global set only)
    cache_capacity: int = CACHE_CAPACITY       # response-cache signatures
    log_level: str = "warning"
    notes: tuple[str, ...] = ()
    bucket_bytes: int = BUCKET_BYTES           # DistributedOptimizer's gradient buckets (torch); 0: none

    @property
    def verbose(self) -> bool:
        """Rank 0 prints the settings it runs with at init."""
        return LOG_LEVELS.index(self.log_level) <= LOG_LEVELS.index("info")

    @property
    def quiet(self) -> bool:
        """Rank 0 does not print `notes`."""
        return LOG_LEVELS.index(self.log_level) >= LOG_LEVELS.index("error")


def read(environ) -> Settings:
    """The settings in `environ` (see the module docstring). ValueError naming the variable for a value that is
    not a number where one is needed."""
    notes: list[str] = []
    won = set()  # HOROVOD_* names that a TRAINRUN_* one overrides

    def pick(name: str | None, *horovod: str) -> tuple[str, str] | None:
        """(variable, value) of TRAINRUN_<name> (None: no such name), else of the first HOROVOD_* name set."""
        if name is not None and f"TRAINRUN_{name}" in environ:
            won.update(h for h in horovod if h in environ)
            return f"TRAINRUN_{name}", environ[f"TRAINRUN_{name}"]
        return next(((h, environ[h]) for h in horovod if h in environ), None)

    def number(found, default, kind=int, minimum=0):
        if found is None:
            return default
        var, text = found
        try:
            value = kind(text.strip())
        except ValueError:
            value = None
        if value is None or value < minimum or (kind is float and math.isnan(value)):
            raise ValueError(f"{var}={text!r}: expected a {'whole ' if kind is int else ''}number >= {minimum}")
        return value

    fusion = number(pick("FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD"), FUSION_THRESHOLD)
    capacity = number(pick("CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY"), CACHE_CAPACITY)
    stall = _stall_timeout(environ, pick, number, notes)
    timeline = pick("TIMELINE", "HOROVOD_TIMELINE")
    timeline_path = timeline[1] if timeline and timeline[1] else None
    if timeline and timeline[0] == "HOROVOD_TIMELINE" and timeline[1].upper() == "DYNAMIC":
        notes.append(_note("HOROVOD_TIMELINE", "DYNAMIC (hvd.start_timeline) is not supported; give a file path"))
        timeline_path = None
    level = pick("LOG_LEVEL", "HOROVOD_LOG_LEVEL")
    log_level = "warning"
    if level:
        if level[1].strip().lower() in LOG_LEVELS:
            log_level = level[1].strip().lower()
        else:
            notes.append(_note(level[0], f"{level[1]!r} is not one of {', '.join(LOG_LEVELS)}"))
    _operations(environ, notes)
    notes += [_note(h, f"TRAINRUN_{_trainrun_name(h)} is set and wins") for h in sorted(won)]
    notes += unknown(environ)
    buckets = number(pick("BUCKET_BYTES"), BUCKET_BYTES)
    return Settings(fusion, stall, timeline_path, capacity, log_level, tuple(notes), buckets)


def _stall_timeout(environ, pick, number, notes: list[str]) -> float:
    own = pick("STALL_TIMEOUT", "HOROVOD_STALL_CHECK_DISABLE", "HOROVOD_STALL_CHECK_TIME_SECONDS",
               "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")
    if own is not None and own[0] == "TRAINRUN_STALL_TIMEOUT":
        return number(own, STALL_TIMEOUT, float)
    if environ.get("HOROVOD_STALL_CHECK_DISABLE", "").strip().lower() in _TRUE:
        for h in ("HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"):
            if h in environ:
                notes.append(_note(h, "HOROVOD_STALL_CHECK_DISABLE is set"))
        return math.inf
    check = number(pick(None, "HOROVOD_STALL_CHECK_TIME_SECONDS"), None, float)
    shutdown = number(pick(None, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"), None, float)
    if shutdown:  # Horovod: 0 (its default) never shuts down
        if check is not None:
            notes.append(_note("HOROVOD_STALL_CHECK_TIME_SECONDS", "a stall is one error here, raised at "
                               f"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={shutdown:g} (Horovod only warns at the check time)"))
        return shutdown
    if check is not None:
        return check if check > 0 else STALL_TIMEOUT
    return STALL_TIMEOUT


def _operations(environ, notes: list[str]) -> None:
    gpu = environ.get("HOROVOD_GPU_OPERATIONS", "").strip().lower()
    if gpu and gpu not in ("nccl", "mpi"):
        notes.append(_note("HOROVOD_GPU_OPERATIONS", f"{gpu!r}: CUDA tensors go through nccl (default) or mpi here"))
    for name in ("HOROVOD_CPU_OPERATIONS", "HOROVOD_CONTROLLER"):
        value = environ.get(name, "").strip().lower()
        if value and value != "mpi":
            notes.append(_note(name, f"{value!r}: trainrun always uses MPI"))
    elastic = environ.get("HOROVOD_ELASTIC", "").strip().lower()
    if elastic in _TRUE and "TRAINRUN_ELASTIC" not in environ:
        notes.append(_note("HOROVOD_ELASTIC", "a job is elastic when trainrun starts it with --min-np, --max-np "
                           "or --host-discovery-script"))


def unknown(environ) -> list[str]:
    """One note per HOROVOD_* variable that nothing in trainrun reads, sorted by name."""
    out = []
    for name in sorted(n for n in environ if n.startswith("HOROVOD_") and n not in READ):
        if name.startswith(("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_", "HOROVOD_CROSS_")) and \
                environ.get("TRAINRUN_" + name[len("HOROVOD_"):]) == environ[name]:
            continue  # set to the same place as trainrun's contract (a horovodrun-style launcher did that)
        why = NO_EFFECT.get(name) or next((w for p, w in NO_EFFECT.items() if p.endswith("_") and name.startswith(p)),
                                          "not a setting trainrun knows")
        out.append(_note(name, why))
    return out


def _note(name: str, why: str) -> str:
    return f"trainrun: {name} has no effect: {why}"


def _trainrun_name(horovod: str) -> str:
    return {"HOROVOD_STALL_CHECK_DISABLE": "STALL_TIMEOUT", "HOROVOD_STALL_CHECK_TIME_SECONDS": "STALL_TIMEOUT",
            "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "STALL_TIMEOUT"}.get(horovod, horovod[len("HOROVOD_"):])
