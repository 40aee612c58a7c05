"""The rank side's settings from the environment: trainrun's TRAINRUN_* names and Horovod's HOROVOD_* ones. Pure.

The one reader of the ranks' settings: `read(environ)` returns one `Settings`, which `lifecycle.init` makes
once (per init) and hands down: to the session (context.Session), which gives the engines their numbers, the
waiting policy (waiting.Policy from `wait_mode`) and the straggler switch; the framework bindings and
elastic/ read theirs through `lifecycle.settings()`. Nothing on the rank side reads these variables anywhere
else, and nothing is read at import. A bad value fails init with ValueError naming the variable.

Each setting has a TRAINRUN_* name and the HOROVOD_* name(s) Horovod users already set; TRAINRUN_* wins when both
are set (the HOROVOD_* one is then noted as having no effect).

    setting           TRAINRUN_*                  HOROVOD_*                                default
    fusion_threshold  TRAINRUN_FUSION_THRESHOLD   HOROVOD_FUSION_THRESHOLD (bytes; 0: no fusion)   64 MiB
    cache_capacity    TRAINRUN_CACHE_CAPACITY     HOROVOD_CACHE_CAPACITY (0: no response cache)     4096
    stall_timeout     TRAINRUN_STALL_TIMEOUT      HOROVOD_STALL_SHUTDOWN_TIME_SECONDS when > 0, else
                                                  HOROVOD_STALL_CHECK_TIME_SECONDS; inf with
                                                  HOROVOD_STALL_CHECK_DISABLE=1                     60 s
    timeline_path     TRAINRUN_TIMELINE           HOROVOD_TIMELINE (a file path)                    none
    log_level         TRAINRUN_LOG_LEVEL          HOROVOD_LOG_LEVEL                                 warning
    bucket_bytes      TRAINRUN_BUCKET_BYTES       (none: the gradient buckets of torch's and         25 MiB
                                                  TF's optimizers, torch/buckets.py, tensorflow/reduce.py;
                                                  0: per gradient in torch, one bucket in TF graphs)
    gpu_operations    TRAINRUN_GPU_OPERATIONS     HOROVOD_GPU_OPERATIONS: nccl|mpi, how CUDA        "" (nccl
                      (set by the launcher for    tensors are reduced (mpi: staged through host      where
                      --allow-gpu-sharing)        memory); another HOROVOD_ value is noted, unset    libnccl loads)
    wait_mode         TRAINRUN_WAIT               (none: auto|spin|block, runtime/waiting.py)        auto
    straggler         TRAINRUN_STRAGGLER          (none: 0 turns the engine's straggler counters     on
                                                  off, runtime/meter.py; 1 on; also false/true,
                                                  no/yes, off/on; another value fails init)
    elastic           TRAINRUN_ELASTIC=1          HOROVOD_ELASTIC=1 (Horovod's meaning: a one-rank   off
                      (the launcher's, elastic    DistributedOptimizer still reduces, torch/optimizer.py)
                      jobs)
    restart_count     TRAINRUN_RESTART_COUNT      (none: the launcher's attempt number; elastic/)    0
    host_updates      TRAINRUN_HOST_UPDATES       (none: the launcher's 0 says no host change will   on
                                                  be announced: State.commit skips the check)
    diag_fd           TRAINRUN_DIAG_FD            (none: the launcher's diag pipe, "FD:INODE";       none
                                                  runtime/rankhook.py, installed by init)
    stacks_dir        TRAINRUN_STACKS_DIR         (none: where the faulthandler file goes)           temp dir

A stall is one error here (StallError on every rank that waits), where Horovod warns at the check time
and shuts down at the shutdown time only if that is set: so the error comes at the shutdown time when the
user asked for one, else at the check time. HOROVOD_CPU_OPERATIONS=mpi and HOROVOD_CONTROLLER=mpi are
what trainrun does anyway.

Every other HOROVOD_* variable (horovod_no_effect.py: the one list of those, which horovodrun reads too),
and a value the runtime cannot honour, becomes one line in `notes` (`trainrun: HOROVOD_X has no effect:
why`), which rank 0 prints once at init unless the log level is error or fatal. At trace/debug/info rank
0 also prints the settings the engine runs with.

Read elsewhere on the rank side, and why (the rest of the one list):
- the launcher's contract of the rank's place (TRAINRUN_RANK, _SIZE, _LOCAL_RANK, ... ): topology.check_env,
  at init, checks it against the MPI world; it is the launcher's word on where the rank is, not a setting.
- TRAINRUN_CTL_FD: elastic/client.py, when the first elastic State is made (maybe before init): the control
  socket is the process's inherited fd, one socket object for the process's life, whatever the session.
- TRAINRUN_CACHE_DIR, CXX, TRAINRUN_TF_NATIVE: tensorflow/native/, when TensorFlow's kernel is first built or
  loaded: a per-process build cache and compiler, read where the kernel is compiled, not session settings.
- KERAS_BACKEND: set (if unset) by keras/ and tensorflow/keras/ at import, before Keras is imported: Keras
  reads it at its own import, so no later moment exists.
- TRAINRUN_TEST_COMMIT_HOOK: wire/shm_slot.py, a test hook of the segment writer (shared with the
  launcher's side, which has no Settings), read once at import.
- PMI_FD, PMI_RANK, PMI_SIZE: MPICH's, read by MPI_Init (mpi4py's import), not by trainrun.
Written, not read as settings: elastic/spare.py replaces a warm rank's environment before its program starts
(so before init reads it), and the shim's horovod.common.util.env sets variables for a block (Horovod's API).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Optional, Union

from trainrun import horovod_no_effect
from trainrun.runtime import waiting
from trainrun.runtime.cache import CAPACITY as CACHE_CAPACITY

FUSION_THRESHOLD = 64 * 1024 * 1024
BUCKET_BYTES = 25 << 20  # torch DDP's bucket size: a large model still overlaps reduction with backward
STALL_TIMEOUT = 60.0
LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "fatal")
GPU_OPERATIONS = ("nccl", "mpi")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

# HOROVOD_* names that the runtime does not act on, and why (one list for both sides: horovod_no_effect.py)
NO_EFFECT = horovod_no_effect.NO_EFFECT
# Read here: never reported as unknown.
READ = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CACHE_CAPACITY", "HOROVOD_STALL_CHECK_DISABLE",
        "HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_TIMELINE",
        "HOROVOD_LOG_LEVEL", "HOROVOD_GPU_OPERATIONS", "HOROVOD_CPU_OPERATIONS", "HOROVOD_CONTROLLER",
        "HOROVOD_ELASTIC")

Found = Optional[tuple[str, str]]  # (variable, value) of the name that gives a setting, None: none set
Pick = Callable[..., Found]
Number = Union[int, float]


@dataclass(frozen=True)
class Settings:
    """What the runtime runs with (the module docstring's table); `notes`: lines for rank 0's log (HOROVOD_*
    variables with no effect)."""

    fusion_threshold: int = FUSION_THRESHOLD   # bytes
    stall_timeout: float = STALL_TIMEOUT       # seconds; math.inf: never a StallError
    timeline_path: str | None = None           # a Chrome trace written at shutdown (global set only)
    cache_capacity: int = CACHE_CAPACITY       # response-cache signatures
    log_level: str = "warning"
    notes: tuple[str, ...] = ()
    bucket_bytes: int = BUCKET_BYTES           # optimizers' gradient buckets (torch, TF graphs); 0: none
    gpu_operations: str = ""                   # "nccl" or "mpi" for CUDA tensors; "": nccl where libnccl loads
    wait_mode: str = "auto"                    # the waiting policy's mode (waiting.MODES)
    straggler: bool = True                     # the engine keeps its straggler counters (meter.py)
    elastic: bool = False                      # an elastic job (or HOROVOD_ELASTIC=1)
    restart_count: int = 0                     # the launcher's attempt number (elastic jobs)
    host_updates: bool = True                  # the launcher may announce a host change (elastic sizing)
    diag_fd: str | None = None                 # the launcher's diag pipe, "FD:INODE" (runtime/rankhook.py)
    stacks_dir: str | None = None              # where the faulthandler's stack file goes (None: the temp dir)

    @property
    def verbose(self) -> bool:
        """Rank 0 prints the settings it runs with at init."""
        return LOG_LEVELS.index(self.log_level) <= LOG_LEVELS.index("info")

    @property
    def quiet(self) -> bool:
        """Rank 0 does not print `notes`."""
        return LOG_LEVELS.index(self.log_level) >= LOG_LEVELS.index("error")


def read(environ: Mapping[str, str]) -> Settings:
    """The settings in `environ` (see the module docstring). ValueError naming the variable for a value that is
    not a number where one is needed, or not one of a setting's choices."""
    notes: list[str] = []
    won: set[str] = set()  # HOROVOD_* names that a TRAINRUN_* one overrides

    def pick(name: str | None, *horovod: str) -> Found:
        """(variable, value) of TRAINRUN_<name> (None: no such name), else of the first HOROVOD_* name set."""
        if name is not None and f"TRAINRUN_{name}" in environ:
            won.update(h for h in horovod if h in environ)
            return f"TRAINRUN_{name}", environ[f"TRAINRUN_{name}"]
        return next(((h, environ[h]) for h in horovod if h in environ), None)

    fusion = int(_number(pick("FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD"), FUSION_THRESHOLD))
    capacity = int(_number(pick("CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY"), CACHE_CAPACITY))
    stall = _stall_timeout(environ, pick, notes)
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
    gpu_operations = _gpu_operations(environ, notes)
    _operations(environ, notes)
    notes += [_note(h, f"TRAINRUN_{_trainrun_name(h)} is set and wins") for h in sorted(won)]
    notes += unknown(environ)
    buckets = int(_number(pick("BUCKET_BYTES"), BUCKET_BYTES))
    return Settings(
        fusion_threshold=fusion, stall_timeout=stall, timeline_path=timeline_path, cache_capacity=capacity,
        log_level=log_level, notes=tuple(notes), bucket_bytes=buckets, gpu_operations=gpu_operations,
        wait_mode=waiting.mode_from(environ.get(waiting.ENV)),
        straggler=_flag(environ, "TRAINRUN_STRAGGLER", True),
        # Horovod's test (torch's DistributedOptimizer: HOROVOD_ELASTIC == '1'); the launcher sets TRAINRUN_ELASTIC=1
        elastic="1" in (environ.get("TRAINRUN_ELASTIC"), environ.get("HOROVOD_ELASTIC")),
        restart_count=int(_number(pick("RESTART_COUNT"), 0)),
        host_updates=_flag(environ, "TRAINRUN_HOST_UPDATES", True),
        diag_fd=environ.get("TRAINRUN_DIAG_FD") or None,
        stacks_dir=environ.get("TRAINRUN_STACKS_DIR") or None)


def _number(found: Found, default: Number, kind: type = int, minimum: Number = 0) -> Number:
    """The number `found` gives (its kind, at least `minimum`), `default` when nothing is set; else ValueError
    naming the variable."""
    if found is None:
        return default
    var, text = found
    value: Number | None
    try:
        value = kind(text.strip())
    except ValueError:
        value = None
    if value is None or value < minimum or (kind is float and math.isnan(value)):
        raise ValueError(f"{var}={text!r}: expected a {'whole ' if kind is int else ''}number >= {minimum}")
    return value


def _flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """A yes/no variable: 1/true/yes/on or 0/false/no/off (any case); unset or empty: `default`; else ValueError."""
    text = environ.get(name, "")
    value = text.strip().lower()
    if not value:
        return default
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise ValueError(f"{name}={text!r}: expected 1 or 0 (or true/false, yes/no, on/off)")


def _gpu_operations(environ: Mapping[str, str], notes: list[str]) -> str:
    """TRAINRUN_GPU_OPERATIONS (nccl|mpi; empty: unset; else ValueError), else HOROVOD_GPU_OPERATIONS when it is
    nccl or mpi (any other value is a Horovod build setting, NCCL, DDL, ...: noted, counted as unset)."""
    horovod = environ.get("HOROVOD_GPU_OPERATIONS", "").strip().lower()
    if horovod and horovod not in GPU_OPERATIONS:
        notes.append(_note("HOROVOD_GPU_OPERATIONS", f"{horovod!r}: CUDA tensors go through nccl (default) or mpi here"))
    own = environ.get("TRAINRUN_GPU_OPERATIONS")
    if own is None:
        return horovod if horovod in GPU_OPERATIONS else ""
    choice = own.strip().lower()
    if choice not in ("", *GPU_OPERATIONS):
        raise ValueError(f"TRAINRUN_GPU_OPERATIONS={own!r}: use 'nccl' or 'mpi'")
    return choice


def _stall_timeout(environ: Mapping[str, str], pick: Pick, notes: list[str]) -> float:
    own = pick("STALL_TIMEOUT", "HOROVOD_STALL_CHECK_DISABLE", "HOROVOD_STALL_CHECK_TIME_SECONDS",
               "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")
    if own is not None and own[0] == "TRAINRUN_STALL_TIMEOUT":
        return float(_number(own, STALL_TIMEOUT, float))
    if environ.get("HOROVOD_STALL_CHECK_DISABLE", "").strip().lower() in _TRUE:
        for h in ("HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"):
            if h in environ:
                notes.append(_note(h, "HOROVOD_STALL_CHECK_DISABLE is set"))
        return math.inf
    check_found = pick(None, "HOROVOD_STALL_CHECK_TIME_SECONDS")
    check = None if check_found is None else float(_number(check_found, 0, float))
    shutdown = float(_number(pick(None, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"), 0, float))
    if shutdown:  # Horovod: 0 (its default) never shuts down
        if check is not None:
            notes.append(_note("HOROVOD_STALL_CHECK_TIME_SECONDS", "a stall is one error here, raised at "
                               f"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={shutdown:g} (Horovod only warns at the check time)"))
        return shutdown
    if check is not None:
        return check if check > 0 else STALL_TIMEOUT
    return STALL_TIMEOUT


def _operations(environ: Mapping[str, str], notes: list[str]) -> None:
    for name in ("HOROVOD_CPU_OPERATIONS", "HOROVOD_CONTROLLER"):
        value = environ.get(name, "").strip().lower()
        if value and value != "mpi":
            notes.append(_note(name, f"{value!r}: trainrun always uses MPI"))
    elastic = environ.get("HOROVOD_ELASTIC", "").strip().lower()
    if elastic in _TRUE and "TRAINRUN_ELASTIC" not in environ:
        notes.append(_note("HOROVOD_ELASTIC", "a job is elastic when trainrun starts it with --min-np, --max-np "
                           "or --host-discovery-script"))


def unknown(environ: Mapping[str, str]) -> list[str]:
    """One note per HOROVOD_* variable that nothing in trainrun reads, sorted by name."""
    out = []
    for name in sorted(n for n in environ if n.startswith("HOROVOD_") and n not in READ):
        if name.startswith(("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_", "HOROVOD_CROSS_")) and \
                environ.get("TRAINRUN_" + name[len("HOROVOD_"):]) == environ[name]:
            continue  # set to the same place as trainrun's contract (a horovodrun-style launcher did that)
        verdict = horovod_no_effect.verdict(name)
        out.append(_note(name, verdict.for_variable() if verdict is not None else "not a setting trainrun knows"))
    return out


def _note(name: str, why: str) -> str:
    return f"trainrun: {name} has no effect: {why}"


def _trainrun_name(horovod: str) -> str:
    return {"HOROVOD_STALL_CHECK_DISABLE": "STALL_TIMEOUT", "HOROVOD_STALL_CHECK_TIME_SECONDS": "STALL_TIMEOUT",
            "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "STALL_TIMEOUT"}.get(horovod, horovod[len("HOROVOD_"):])
