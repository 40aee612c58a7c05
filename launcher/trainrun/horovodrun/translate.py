"""horovodrun argv -> trainrun argv + notes: pure (no processes, no files but --config-file's).

Every horovodrun 0.28.1 option ends in one of three ways:
  done     translated to trainrun's own option, or to the HOROVOD_* variable horovodrun would set for
           the ranks (`-x NAME=VALUE`) where the runtime reads it (runtime/horovod_env.py);
  noted    accepted, with ONE line saying why it has no effect here (`notes`; printed before the launch;
           its variable is not set, so rank 0 does not say it again);
  refused  UsageError naming the trainrun way (exit 2).
docs/guides/horovod.md has the table (docs/reference/horovodrun-cli.md: every option, generated); tests/unit/test_horovodrun_translate.py has a case per option.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from trainrun import horovod_no_effect as no_effect
from trainrun.errors import UsageError
from trainrun.horovodrun.options import build_parser

HOROVOD_API_VERSION = "0.28.1"  # the horovodrun whose command line this one accepts


@dataclass(frozen=True)
class Translation:
    """What horovodrun does: `action` run (trainrun `argv`), help, version or check-build. `notes`: one
    line per option accepted with no effect (its HOROVOD_* variable is not set). `slots_per_host`: the discovery script's hosts that print
    no slots get this many (main wraps the script; trainrun's default is 1)."""

    action: str = "run"
    argv: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    slots_per_host: int | None = None
    env: dict = field(default_factory=dict)   # HOROVOD_* and other variables for the ranks (also in argv as -x)

    def with_discovery_script(self, path: str) -> Translation:
        """The same launch with --host-discovery-script replaced by `path` (main's wrapper)."""
        argv = list(self.argv)
        i = argv.index("--host-discovery-script")
        argv[i + 1] = path
        return Translation(self.action, tuple(argv), self.notes, self.slots_per_host, self.env)


# option dest -> the HOROVOD_* variable horovodrun sets from it
OPTION_VARS = {
    "fusion_threshold_mb": "HOROVOD_FUSION_THRESHOLD", "cycle_time_ms": "HOROVOD_CYCLE_TIME",
    "cache_capacity": "HOROVOD_CACHE_CAPACITY", "hierarchical_allreduce": "HOROVOD_HIERARCHICAL_ALLREDUCE",
    "hierarchical_allgather": "HOROVOD_HIERARCHICAL_ALLGATHER", "autotune": "HOROVOD_AUTOTUNE",
    "autotune_log_file": "HOROVOD_AUTOTUNE_LOG", "autotune_warmup_samples": "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
    "autotune_steps_per_sample": "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE",
    "autotune_bayes_opt_max_samples": "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
    "autotune_gaussian_process_noise": "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
    "timeline_filename": "HOROVOD_TIMELINE", "timeline_mark_cycles": "HOROVOD_TIMELINE_MARK_CYCLES",
    "no_stall_check": "HOROVOD_STALL_CHECK_DISABLE", "stall_check_warning_time_seconds": "HOROVOD_STALL_CHECK_TIME_SECONDS",
    "stall_check_shutdown_time_seconds": "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
    "mpi_threads_disable": "HOROVOD_MPI_THREADS_DISABLE", "num_nccl_streams": "HOROVOD_NUM_NCCL_STREAMS",
    "thread_affinity": "HOROVOD_THREAD_AFFINITY", "gloo_timeout_seconds": "HOROVOD_GLOO_TIMEOUT_SECONDS",
    "log_level": "HOROVOD_LOG_LEVEL", "log_with_timestamp": "HOROVOD_LOG_HIDE_TIME",
}
# Options whose HOROVOD_* variable has no effect in the ranks, and why (horovod_no_effect.py: the one list, which
# the runtime's notes read too). Such an option is noted and its variable not set, so the note is said once,
# here, and not again by rank 0 at init.
NO_MECHANISM = {dest: found.for_option() for dest, var in OPTION_VARS.items()
                if (found := no_effect.verdict(var)) is not None}


def horovod_env(ns) -> dict[str, str]:
    """The variables horovodrun 0.28.1 sets for the ranks from these options (its config_parser's rules)."""
    env: dict[str, str] = {}

    def put(name: str, value, fn=str):
        if value is not None:
            env[name] = fn(value)

    def b(v):
        return "1" if v else "0"

    put("HOROVOD_FUSION_THRESHOLD", ns.fusion_threshold_mb, lambda v: str(v * 1024 * 1024))
    put("HOROVOD_CYCLE_TIME", ns.cycle_time_ms)
    put("HOROVOD_CACHE_CAPACITY", ns.cache_capacity)
    put("HOROVOD_HIERARCHICAL_ALLREDUCE", ns.hierarchical_allreduce, b)
    put("HOROVOD_HIERARCHICAL_ALLGATHER", ns.hierarchical_allgather, b)
    if ns.autotune:
        put("HOROVOD_AUTOTUNE", ns.autotune, b)
        put("HOROVOD_AUTOTUNE_LOG", ns.autotune_log_file)
        put("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", ns.autotune_warmup_samples)
        put("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", ns.autotune_steps_per_sample)
        put("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", ns.autotune_bayes_opt_max_samples)
        put("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", ns.autotune_gaussian_process_noise)
    if ns.timeline_filename:
        put("HOROVOD_TIMELINE", ns.timeline_filename)
        put("HOROVOD_TIMELINE_MARK_CYCLES", ns.timeline_mark_cycles, b)
    put("HOROVOD_STALL_CHECK_DISABLE", ns.no_stall_check, b)
    put("HOROVOD_STALL_CHECK_TIME_SECONDS", ns.stall_check_warning_time_seconds)
    put("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", ns.stall_check_shutdown_time_seconds)
    put("HOROVOD_MPI_THREADS_DISABLE", ns.mpi_threads_disable, b)
    put("HOROVOD_NUM_NCCL_STREAMS", ns.num_nccl_streams)
    if ns.tcp_flag:
        env["NCCL_IB_DISABLE"] = "1"
        env["UCX_TLS"] = "tcp,sm,self"  # MPICH's transport: TCP between hosts, shared memory within one, no RDMA
    put("HOROVOD_THREAD_AFFINITY", ns.thread_affinity)
    put("HOROVOD_GLOO_TIMEOUT_SECONDS", ns.gloo_timeout_seconds)
    put("HOROVOD_LOG_LEVEL", ns.log_level)
    put("HOROVOD_LOG_HIDE_TIME", ns.log_with_timestamp, lambda v: "0" if v else "1")
    return env


def _check_ranges(ns) -> None:
    """horovodrun's own checks (config_parser.validate_config_args), as one-line usage errors."""
    for dest in ("num_proc", "min_num_proc", "max_num_proc", "slots"):
        v = getattr(ns, dest)
        if v is not None and v < 1:
            raise UsageError(f"--{dest.replace('_', '-')} {v}: must be at least 1")
    for dest in ("fusion_threshold_mb", "cycle_time_ms", "cache_capacity", "autotune_warmup_samples",
                 "autotune_steps_per_sample", "autotune_bayes_opt_max_samples", "stall_check_warning_time_seconds",
                 "stall_check_shutdown_time_seconds", "num_nccl_streams", "thread_affinity", "gloo_timeout_seconds",
                 "start_timeout", "elastic_timeout", "reset_limit"):
        v = getattr(ns, dest)
        if v is not None and v < 0:
            raise UsageError(f"--{dest.replace('_', '-')} {v:g}: must be >= 0")
    noise = ns.autotune_gaussian_process_noise
    if noise is not None and not 0 <= noise <= 1:
        raise UsageError(f"--autotune-gaussian-process-noise {noise:g}: must be in [0, 1]")
    if ns.start_timeout == 0:
        raise UsageError("--start-timeout 0: must be more than 0 seconds")


def _launcher_args(option: str, text: str, out: list[str]) -> list[str]:
    """mpirun arguments (--mpi-args, --binding-args): those trainrun has (-x, --oversubscribe, --bind-to
    core|none) appended to `out`; the rest returned (they have no effect here)."""
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise UsageError(f"{option} '{text}': {err}") from None
    rest, i = [], 0
    while i < len(words):
        w = words[i]
        flag = "--" + w.lstrip("-")
        if flag in ("--x", "--export") and i + 1 < len(words):
            out += ["-x", words[i + 1]]
            i += 2
        elif flag == "--oversubscribe":
            out.append("--oversubscribe")
            i += 1
        elif flag == "--bind-to" and i + 1 < len(words) and words[i + 1] in ("core", "none"):
            out += ["--bind-to", words[i + 1]]
            i += 2
        else:
            rest.append(w)
            i += 1
    return rest


def translate(argv: list[str], environ) -> Translation:
    """horovodrun's argv -> what to do. UsageError (exit 2) for a parse error or a refused option."""
    parser = build_parser()
    ns = parser.parse_args(list(argv))
    if ns.help:
        return Translation("help")
    if ns.version:
        return Translation("version")
    if ns.check_build:
        return Translation("check-build")
    notes: list[str] = []
    if ns.config_file:
        from trainrun.horovodrun import config_file

        notes += config_file.apply(ns, config_file.load(ns.config_file), ns.config_file)
    _check_ranges(ns)
    if ns.use_jsrun:
        raise UsageError("--jsrun: trainrun does not launch through LSF's jsrun; name the hosts with -H or "
                         "--hostfile (inside Slurm, trainrun takes them from the allocation)")
    command = list(ns.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("no command to run; write horovodrun -np 2 python train.py")

    out: list[str] = []
    if ns.num_proc is not None:
        out += ["-np", str(ns.num_proc)]
    if ns.hosts:
        out += ["-H", ns.hosts]
    if ns.hostfile:
        out += ["--hostfile", ns.hostfile]
    if ns.ssh_port is not None:
        out += ["-p", str(ns.ssh_port)]
    if ns.ssh_identity_file:
        out += ["-i", ns.ssh_identity_file]
    if ns.nics:
        out += ["--network-interface", ",".join(ns.nics)]
    if ns.disable_cache:
        out.append("--no-cache")
    start = ns.start_timeout if ns.start_timeout is not None else environ.get("HOROVOD_START_TIMEOUT")
    if start is not None:
        out += ["--start-timeout", str(start)]
    if ns.output_filename:
        out += ["--output-dir", ns.output_filename]
    if ns.verbose:
        out.append("-v")
    # Output: Open MPI's `[1,0]<stdout>:` as horovodrun over MPI prints it; Horovod's Gloo form `[0]<stdout>:` with --gloo
    form = "rank" if ns.use_gloo else "mpi"
    if ns.prefix_output_with_timestamp:
        form = "timestamp" if form == "rank" else "mpi-timestamp"
    out += ["--prefix", form]
    if ns.use_gloo:
        notes.append("--gloo: the ranks run in trainrun's MPI world (there is no Gloo controller here); "
                     "Horovod's API is the same over it")
    slots = _elastic(ns, environ, out, notes)
    if ns.mpi_args:
        rest = _launcher_args("--mpi-args", ns.mpi_args, out)
        if rest:
            notes.append(f"--mpi-args: {shlex.join(rest)} has no effect: trainrun starts the ranks itself (no mpirun); "
                         "-x, --oversubscribe and --bind-to core|none are taken")
    if ns.binding_args:
        rest = _launcher_args("--binding-args", ns.binding_args, out)
        if rest:
            notes.append(f"--binding-args: {shlex.join(rest)} has no effect: trainrun binds with --bind-to core|none only")
    env = horovod_env(ns)
    for dest, why in NO_MECHANISM.items():
        if getattr(ns, dest) is not None:
            notes.append(f"--{dest.replace('_', '-')} has no effect: {why}")
            env.pop(OPTION_VARS[dest], None)
    if "HOROVOD_AUTOTUNE" not in env:
        env = {k: v for k, v in env.items() if not k.startswith("HOROVOD_AUTOTUNE_")}
    for name, value in env.items():
        out += ["-x", f"{name}={value}"]
    return Translation("run", tuple(out + ["--"] + command), tuple(notes), slots, env)


def _elastic(ns, environ, out: list[str], notes: list[str]) -> int | None:
    """The elastic options: trainrun's own when the job is elastic (as in horovodrun: --min-np or a host
    discovery script), else each one given is noted. Returns --slots-per-host when main must wrap the script."""
    given = {"--max-np": ns.max_num_proc, "--slots-per-host": ns.slots, "--reset-limit": ns.reset_limit,
             "--elastic-timeout": ns.elastic_timeout, "--blacklist-cooldown-range": ns.cooldown_range}
    if ns.host_discovery_script is None and ns.min_num_proc is None:
        for name, value in given.items():
            if value is not None:
                notes.append(f"{name} has no effect: the job is not elastic without --min-np or "
                             "--host-discovery-script (as in horovodrun)")
        return None
    lo = ns.min_num_proc if ns.min_num_proc is not None else ns.num_proc  # horovodrun: --min-np defaults to -np
    if lo is not None:
        out += ["--min-np", str(lo)]
    if ns.max_num_proc is not None:
        out += ["--max-np", str(ns.max_num_proc)]
    if ns.host_discovery_script:
        out += ["--host-discovery-script", ns.host_discovery_script]
    timeout = ns.elastic_timeout if ns.elastic_timeout is not None else environ.get("HOROVOD_ELASTIC_TIMEOUT")
    if timeout is not None:
        out += ["--elastic-timeout", str(timeout)]
    if ns.cooldown_range:
        out += ["--blacklist-cooldown-range", *map(str, ns.cooldown_range)]
    if ns.reset_limit is not None:
        out += ["--max-restarts", str(ns.reset_limit)]
    if ns.slots is not None and not ns.host_discovery_script:
        notes.append("--slots-per-host has no effect: it gives slots to a discovery script's hosts; -H/--hostfile "
                     "name their own (as in horovodrun)")
        return None
    return ns.slots
