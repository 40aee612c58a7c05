"""The reference pages of the user's guide, generated from the code when the site is built (`mkdocs build`).

mkdocs.yml names this file as a hook: a page's line `<!-- generated: NAME -->` is replaced by `render(NAME)`,
Markdown made from the code itself, so the reference cannot drift from it:

    trainrun-options    every option of the `trainrun` command (click: names, type, default, help)
    horovodrun-options  every option of `horovodrun` (its argparse parser) and what trainrun does with it,
                        found by translating a command line with that option (horovodrun/translate.py)
    env-contract        what the launcher sets in every rank (plan/envcontract.py's rank_env, with every
                        feature on), and what a rank's host adds
    env-forwarded       what a remote rank inherits from the launcher (envcontract.FORWARD_*)
    env-settings        what the runtime reads at hvd.init (runtime/horovod_env.py, the one settings reader)
    env-no-effect       Horovod's HOROVOD_* variables that have no effect, and why (horovod_no_effect.py)
    env-launcher        variables the launcher, horovodrun and trainrun.run read
    env-internal        variables between trainrun's own processes (set by trainrun, not by users)
    exit-codes          errors.py's classes and their codes
    benchmark-pages     a link to every page of docs/benchmarks/
    horovod-api         Horovod 0.28.1's public names per module, and whether trainrun's alias has each one
                        (the lists of the public-name tests, tests/runtime/test_torch_api.py and
                        tests/tensorflow/workers/tf_horovod.py, checked the same way: hasattr)

tests/docs/ checks the other way round: every option of the two commands and every TRAINRUN_*/HOROVOD_*
name in launcher/trainrun/ appears in the generated pages with a description (ENV below).
"""
from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)

# ---------------------------------------------------------------------------------------------------------------
# Environment variables: name -> (group, what it does). A name ending in `_` or `*` covers every name it starts.
# Groups: contract (set in every rank by the launcher or its host), settings (read by the runtime at init: their
# names come from runtime/horovod_env.py, checked by tests/docs), launcher (read by the trainrun/horovodrun
# commands or trainrun.run), internal (between trainrun's own processes). HOROVOD_* names that have no effect are
# not here: horovod_no_effect.NO_EFFECT is their list, rendered as it is.
# ---------------------------------------------------------------------------------------------------------------
ENV: dict[str, tuple[str, str]] = {
    # the contract
    "RANK": ("contract", "global rank, 0 .. WORLD_SIZE-1"),
    "WORLD_SIZE": ("contract", "number of ranks in the job"),
    "LOCAL_RANK": ("contract", "index of this rank among the ranks on its host"),
    "LOCAL_WORLD_SIZE": ("contract", "number of ranks on this host"),
    "NODE_RANK": ("contract", "index of this host in the job"),
    "NNODES": ("contract", "number of hosts in the job"),
    "MASTER_ADDR": ("contract", "rank 0's address on the chosen NIC (torch's `env://`)"),
    "MASTER_PORT": ("contract", "a port free on rank 0's host"),
    "TRAINRUN_RANK": ("contract", "= RANK"),
    "TRAINRUN_SIZE": ("contract", "= WORLD_SIZE"),
    "TRAINRUN_LOCAL_RANK": ("contract", "= LOCAL_RANK"),
    "TRAINRUN_LOCAL_SIZE": ("contract", "= LOCAL_WORLD_SIZE"),
    "TRAINRUN_CROSS_RANK": ("contract", "index among the ranks with the same local rank (one per host)"),
    "TRAINRUN_CROSS_SIZE": ("contract", "number of ranks with this local rank"),
    "TRAINRUN_HOSTNAME": ("contract", "the host's name as the job names it (`-H`, hostfile, allocation)"),
    "TRAINRUN_JOB_ID": ("contract", "the job's id; at teardown every process of the job that still carries it is killed"),
    "TRAINRUN_GPUS": ("contract", "this rank's GPUs on its host (round robin when there are fewer GPUs than local ranks); "
                                  "ids are the host's (nvidia-smi index, or the entries of a pre-set CUDA_VISIBLE_DEVICES)"),
    "CUDA_VISIBLE_DEVICES": ("contract", "with `--gpus-per-proc K`: this rank's K GPUs, isolated"),
    "TRAINRUN_GPU_OPERATIONS": ("contract", "`mpi` when `--allow-gpu-sharing` puts ranks on one GPU (NCCL needs a GPU per "
                                            "rank); also read by the runtime (settings)"),
    "NCCL_SOCKET_IFNAME": ("contract", "multi-host jobs: the NICs chosen by the probe or `--network-interface`"),
    "GLOO_SOCKET_IFNAME": ("contract", "the same NICs, for Gloo"),
    "UCX_NET_DEVICES": ("contract", "the same NICs, for UCX"),
    "TF_CONFIG": ("contract", "every worker's address and a port its host reported free, task index = rank "
                              "(MultiWorkerMirroredStrategy); with `--tf-cluster` the whole cluster by role. Not set under `--mpi openmpi`"),
    "TRAINRUN_ROLE": ("contract", "`--tf-cluster`: this task's role (chief, worker, ps, evaluator)"),
    "TRAINRUN_ROLE_INDEX": ("contract", "`--tf-cluster`: this task's index within its role"),
    "SLURM_PROCID": ("contract", "inside a Slurm allocation: = RANK (Slurm's own variables agree with the contract)"),
    "SLURM_LOCALID": ("contract", "inside a Slurm allocation: = LOCAL_RANK"),
    "SLURM_NODEID": ("contract", "inside a Slurm allocation: = NODE_RANK"),
    "SLURM_NTASKS": ("contract", "inside a Slurm allocation: = WORLD_SIZE"),
    "SLURM_NPROCS": ("contract", "inside a Slurm allocation: = WORLD_SIZE"),
    "PMI_FD": ("contract", "the rank's PMI-1 socket (MPI world on: `--mpi mpich`, the default); an outer launcher's `PMI_*` are not passed on"),
    "PMI_RANK": ("contract", "= RANK, for MPI_Init"),
    "PMI_SIZE": ("contract", "= WORLD_SIZE, for MPI_Init"),
    "OMP_NUM_THREADS": ("contract", "if unset: the host's usable cores / local ranks, at least 1"),
    "THP_MEM_ALLOC_ENABLE": ("contract", "if unset: `1` (torch's CPU allocator asks for huge pages on tensors >= 2 MiB, as "
                                         "NumPy does for large arrays: MPI reduces them ~1.3x faster); `0` keeps torch's default"),
    "PYTHONPATH": ("contract", "trainrun's `horovod` shim directory first (from the trainrun install of the host that "
                               "starts the rank), unless `--horovod installed`"),
    "TRAINRUN_HOROVOD": ("contract", "which `horovod` the ranks import: `trainrun` (default) or `installed` (`--horovod`, or "
                                     "this variable in the launcher's environment)"),
    "TRAINRUN_RESTART_COUNT": ("contract", "the attempt number of an elastic or `--max-restarts` job (0 first); a restarted "
                                           "`--tf-cluster` worker's restart count"),
    "TRAINRUN_ELASTIC": ("contract", "`1` in an elastic or `--max-restarts` job"),
    "TRAINRUN_HOST_UPDATES": ("contract", "`0` when no host change will be announced (no elastic sizing): "
                                          "`state.commit()` then skips the check"),
    # the runtime's settings (runtime/horovod_env.py)
    "TRAINRUN_FUSION_THRESHOLD": ("settings", "bytes up to which ready tensors are fused into one reduction (default 64 MiB; "
                                              "0: none fused); rank 0's value holds for all. Horovod: HOROVOD_FUSION_THRESHOLD"),
    "HOROVOD_FUSION_THRESHOLD": ("settings", "as TRAINRUN_FUSION_THRESHOLD"),
    "TRAINRUN_CACHE_CAPACITY": ("settings", "signatures the response cache numbers (default 4096; 0: every op is negotiated "
                                            "through rank 0); rank 0's value holds for all. Horovod: HOROVOD_CACHE_CAPACITY"),
    "HOROVOD_CACHE_CAPACITY": ("settings", "as TRAINRUN_CACHE_CAPACITY"),
    "TRAINRUN_STALL_TIMEOUT": ("settings", "seconds after which ranks waiting for a rank that does not take part fail with "
                                           "`StallError` naming it (default 60); wins over the three `HOROVOD_STALL_*` below"),
    "HOROVOD_STALL_CHECK_TIME_SECONDS": ("settings", "the stall time (Horovod only warns then: here a stall is one error)"),
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": ("settings", "when > 0, the `StallError` comes at this time instead (the check "
                                                        "time is then noted as having no effect)"),
    "HOROVOD_STALL_CHECK_DISABLE": ("settings", "`1`: no `StallError` at all (a rank waits as long as its peers do; "
                                                "`--hang-timeout` still ends a silent job)"),
    "TRAINRUN_TIMELINE": ("settings", "path of a Chrome trace of every tensor's phases (negotiate, pack, reduce, unpack), "
                                      "written by rank 0 at shutdown. Horovod: HOROVOD_TIMELINE"),
    "HOROVOD_TIMELINE": ("settings", "as TRAINRUN_TIMELINE (`DYNAMIC` is not supported: noted)"),
    "TRAINRUN_LOG_LEVEL": ("settings", "`trace`/`debug`/`info`: rank 0 also prints the settings the engine runs with; "
                                       "`warning` (default): the \"no effect\" lines; `error`/`fatal`: neither. Horovod: HOROVOD_LOG_LEVEL"),
    "HOROVOD_LOG_LEVEL": ("settings", "as TRAINRUN_LOG_LEVEL"),
    "TRAINRUN_BUCKET_BYTES": ("settings", "the gradient buckets of torch's `DistributedOptimizer` and of TensorFlow's "
                                          "optimizers in graphs (default 25 MiB, as DDP); `0`: Horovod's one allreduce "
                                          "per gradient in torch, one bucket in TensorFlow graphs"),
    "HOROVOD_GPU_OPERATIONS": ("settings", "`nccl` or `mpi` for CUDA tensors (another value is noted and ignored); "
                                           "TRAINRUN_GPU_OPERATIONS wins"),
    "TRAINRUN_WAIT": ("settings", "how a rank waits for its peers: `auto` (default: polls while the wait is young and the "
                                  "host has a core to spare, else sleeps between polls), `spin`, `block`; another value is an error"),
    "TRAINRUN_STRAGGLER": ("settings", "`0` (or false/no/off) turns the straggler measurement off; `1` (default) on"),
    "HOROVOD_CPU_OPERATIONS": ("settings", "`mpi` is what trainrun does; `gloo`/`ccl` are noted as having no effect"),
    "HOROVOD_CONTROLLER": ("settings", "`mpi` is what trainrun does; `gloo` is noted as having no effect"),
    "HOROVOD_ELASTIC": ("settings", "`1` matches an elastic launch (`--min-np`/`--max-np`/`--host-discovery-script`); "
                                    "outside one it is noted"),
    # read by the launcher, horovodrun or trainrun.run
    "TRAINRUN_MAX_RANKS": ("launcher", "the most ranks a job may have (default 65536); planning is linear in the ranks"),
    "TRAINRUN_PY_SPY": ("launcher", "`off` (or 0/no): take stacks with `faulthandler` (SIGUSR2) instead of py-spy"),
    "TRAINRUN_CACHE_DIR": ("launcher", "where the NIC choice (an hour per host set) and TensorFlow's compiled kernel are "
                                       "cached (default `~/.cache/trainrun`); read by the launcher and by trainrun.tensorflow"),
    "TRAINRUN_TF_NATIVE": ("launcher", "`0`: trainrun.tensorflow does not build or load its C++ kernels (graph errors stay "
                                       "`UnknownError`; each graph collective is one blocking node)"),
    "TRAINRUN_RUN_REMOTE_RESULT_MB": ("launcher", "trainrun.run, in the caller's environment: the most MiB (pickled) a rank on "
                                                  "another host may return (default 64)"),
    "HOROVOD_SPARK_START_TIMEOUT": ("launcher", "horovod.spark.run / trainrun.run(spark=...): seconds for the stage's "
                                                "tasks to connect when `start_timeout` is not given (default 600)"),
    "HOROVOD_START_TIMEOUT": ("launcher", "horovodrun: `--start-timeout` when the option is not given"),
    "HOROVOD_ELASTIC_TIMEOUT": ("launcher", "horovodrun: `--elastic-timeout` when the option is not given"),
    # between trainrun's own processes
    "TRAINRUN_DIAG_FD": ("internal", "the rank's diag pipe to the launcher (stack reports, progress, straggler summaries)"),
    "TRAINRUN_CTL_FD": ("internal", "an elastic rank's control socket (commits, host-update notices)"),
    "TRAINRUN_STACKS_DIR": ("internal", "the job's stack-file directory on the rank's host, for its faulthandler file (made "
                                        "with the host's first rank, removed at the end)"),
    "TRAINRUN_WARM_PAD": ("internal", "room in a warm spare's environment for the next attempt's variables"),
    "TRAINRUN_SPARK_LINKS": ("internal", "trainrun.run(spark=...): the Spark tasks' authenticated sockets the launcher "
                                         "inherits (`host=fd,...`)"),
    "TRAINRUN_RUN_SOCKET": ("internal", "trainrun.run: the caller's socket for return values"),
    "TRAINRUN_RUN_FILE": ("internal", "trainrun.run: a big call's file (jobs on this machine)"),
    "TRAINRUN_RUN_NONCE": ("internal", "trainrun.run: marks a remote rank's result lines"),
    "TRAINRUN_RUN_PIECES": ("internal", "trainrun.run: how many `TRAINRUN_RUN_PIECE_<i>` variables hold the call"),
    "TRAINRUN_RUN_PIECE_": ("internal", "trainrun.run: the pickled call, base64, 100 kB each"),
    "TRAINRUN_RAYEXEC_ADDRESS": ("internal", "horovod.ray: the driver's Ray cluster (GCS address), which an executor's "
                                             "workers join to reach its mailbox actor"),
    "TRAINRUN_RAYEXEC_MAILBOX": ("internal", "horovod.ray: the name (and namespace) of the executor's mailbox actor"),
    "TRAINRUN_TEST_COMMIT_HOOK": ("internal", "a test hook of the committed-state writer"),
}

# Tokens in launcher/trainrun/ that look like variables and are not: what each is.
NOT_VARIABLES = {
    "TRAINRUN_PERF": "the marker of `--check --perf`'s allreduce result line on rank 0's stdout",
    "HOROVOD_API_VERSION": "a Python constant (horovodrun/translate.py): the horovodrun version this one answers to",
    "HOROVOD_X": "a placeholder in docstrings",
}

GROUP_TITLES = {"contract": "Set in every rank", "settings": "Read by the runtime at `hvd.init()`",
                "launcher": "Read by the launcher, horovodrun and trainrun.run",
                "internal": "Between trainrun's own processes (set by trainrun; do not set them)"}


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _code(text: str) -> str:
    return f"`{text}`"


# --- trainrun's options -------------------------------------------------------------------------------------------

def trainrun_params() -> list[Any]:
    """Every option of the `trainrun` command, --help and --version included (click's own list)."""
    import click

    from trainrun.cli.command import cli

    ctx = click.Context(cli, info_name="trainrun")
    return [p for p in cli.get_params(ctx) if isinstance(p, click.Option)]


def option_names(p: Any) -> list[str]:
    return [*p.opts, *p.secondary_opts]


def _click_type(p: Any) -> str:
    import click

    if p.is_flag:
        return "flag"
    t = p.type
    if isinstance(t, click.Tuple):
        return " ".join(_one_type(x) for x in t.types)
    text = _one_type(t)
    if p.metavar and not isinstance(t, click.Choice):
        text = f"{p.metavar}: {text}" if text not in ("text", p.metavar) else p.metavar
    return text + (" (repeatable)" if p.multiple else "")


def _one_type(t: Any) -> str:
    import click

    if isinstance(t, click.Choice):
        return "|".join(t.choices)
    if isinstance(t, (click.IntRange, click.FloatRange)):
        kind = "whole number" if isinstance(t, click.IntRange) else "number"
        return f"{kind} {t._describe_range()}"
    if t.name == "N":
        return "whole number >= 1"
    return {"integer": "whole number", "float": "number"}.get(t.name, t.name)


def _click_default(p: Any) -> str:
    if p.is_flag and not p.secondary_opts:
        return ""
    if p.secondary_opts:
        return p.opts[0] if p.default else p.secondary_opts[0]
    default = p.default
    if default is None or type(default).__name__ == "Sentinel":  # click 8.3: unset defaults are a sentinel
        m = re.search(r"\[default: ([^\]]+)\]", p.help or "")
        return m.group(1) if m else ""
    if isinstance(default, (tuple, list)):
        return " ".join(map(str, default)) if default else ""
    return str(default)


def render_trainrun_options() -> str:
    rows = []
    for p in trainrun_params():
        names = ", ".join(_code(n) for n in option_names(p))
        rows.append((names, _click_type(p), _code(_click_default(p)) if _click_default(p) else "",
                     (p.help or "").replace("  [default: 120]", "")))
    return _table(("option", "value", "default", "what it does"), rows)


# --- horovodrun's options -----------------------------------------------------------------------------------------

def horovodrun_actions() -> list[argparse.Action]:
    from trainrun.horovodrun.options import build_parser

    return [a for a in build_parser()._actions if a.option_strings]


_SAMPLES = {"log_level": "INFO", "mpi_args": "-x FOO=1 --oversubscribe", "binding_args": "--bind-to core",
            "hosts": "h1:2,h2:2", "hostfile": "hosts.txt", "host_discovery_script": "./hosts.sh", "nics": "eth1"}
_ELASTIC = ("min_num_proc", "max_num_proc", "slots", "elastic_timeout", "reset_limit", "cooldown_range")


def horovodrun_verdict(action: argparse.Action, option: str) -> tuple[str, str]:
    """(done|noted|refused|command, what happens) for `option`, found by translating a command line with it."""
    from trainrun.errors import UsageError
    from trainrun.horovodrun.translate import translate

    if action.dest in ("help", "version", "check_build", "config_file"):
        return "done", {"help": "this table's options with their trainrun meaning",
                        "version": "prints `0.28.1 (trainrun X)`",
                        "check_build": "Horovod's layout (`[X] PyTorch`, `[X] MPI`, `[ ] Gloo`, ...)",
                        "config_file": "Horovod's YAML schema; the command line wins; a key outside the schema is noted, "
                                       "a wrong type refused"}[action.dest]
    args = [option]
    if action.nargs != 0:
        sample = _SAMPLES.get(action.dest, {int: "2", float: "0.5"}.get(action.type, "x"))  # type: ignore[arg-type]
        args += [sample] * (action.nargs if isinstance(action.nargs, int) else 1)
    extra = ["--host-discovery-script", "./hosts.sh"] if action.dest in _ELASTIC and action.dest != "host_discovery_script" else []
    try:
        base = translate([*extra, "python", "train.py"], {})
        t = translate([*extra, *args, "python", "train.py"], {})
    except UsageError as err:
        return "refused", str(err)
    notes = [re.sub(r"^-[\w-]+(: | has no effect: )", "", n) for n in t.notes]
    if t.slots_per_host is not None:
        return "done", f"the discovery script's bare `host` lines get {t.slots_per_host} slots"
    if t.argv == base.argv:
        return ("noted", "; ".join(notes)) if notes else ("done", "trainrun's default: " + (action.help or "").rstrip("."))
    words = list(t.argv[:t.argv.index("--")] if "--" in t.argv else t.argv)
    return "done", "`trainrun " + " ".join(words) + "`" + (f" ({'; '.join(notes)})" if notes else "")


def render_horovodrun_options() -> str:
    rows = []
    for a in horovodrun_actions():
        names = ", ".join(_code(n) for n in a.option_strings)
        value = "flag" if a.nargs == 0 else (" ".join(a.metavar) if isinstance(a.metavar, tuple) else
                                             "|".join(a.choices) if a.choices else
                                             {int: "whole number", float: "number"}.get(a.type, "text"))
        rows.append((names, value, *horovodrun_verdict(a, a.option_strings[-1])))
    return _table(("option", "value", "outcome", "what trainrun does (with a sample value)"), rows)


# --- environment --------------------------------------------------------------------------------------------------

def contract_names() -> list[str]:
    """What plan/envcontract.rank_env sets for a rank with every feature on (GPUs isolated, Slurm, NICs, TF_CONFIG,
    --tf-cluster roles, shared GPUs)."""
    from trainrun.plan.envcontract import JobInfo, RankEnvMap, job_env
    from trainrun.plan.roles import Task

    job = JobInfo("job", "10.0.0.1", 29500, nics=("eth1",), isolate_gpus=True, slurm=True, tf_workers=("10.0.0.1:1",),
                  gpu_operations="mpi", tf_tasks=(Task("chief", 0),))
    a = SimpleNamespace(rank=0, size=1, local_rank=0, local_size=1, node_rank=0, nnodes=1, cross_rank=0, cross_size=1,
                        host=SimpleNamespace(name="h1"), gpus=(0,))
    return list(RankEnvMap(a, job_env(job, 1, 1)))  # type: ignore[arg-type]


def settings_names() -> list[str]:
    """Every TRAINRUN_*/HOROVOD_* name the settings reader (runtime/horovod_env.py) reads: READ, the names its
    `read()` builds from `pick("X")` (TRAINRUN_X), its literal names, and the waiting mode's variable."""
    from trainrun.runtime import horovod_env, waiting

    src = Path(horovod_env.__file__).read_text()
    body = src[src.index("def read("):]
    names = set(horovod_env.READ) | {waiting.ENV}
    names |= {f"TRAINRUN_{m}" for m in re.findall(r'pick\("([A-Z_]+)"', body)}
    names |= set(re.findall(r'"((?:TRAINRUN|HOROVOD)_[A-Z_]+)"', body))
    return sorted(names)


def described(name: str) -> tuple[str, str] | None:
    if name in ENV:
        return ENV[name]
    return next((v for k, v in ENV.items() if k.endswith("_") and name.startswith(k)), None)


def render_env(group: str) -> str:
    rows = [(_code(n + "<i>" if n.endswith("_") else n), d) for n, (g, d) in ENV.items() if g == group]
    if group == "contract":
        made = set(contract_names())
        rows = [(n, d + ("" if n.strip("`") in made else " (added where the rank starts)")) for n, d in rows]
    return _table(("variable", "meaning"), rows)


def render_env_forwarded() -> str:
    from trainrun.plan.envcontract import FORWARD_NAMES, FORWARD_PREFIXES

    return ("Remote ranks get their login environment plus these from the launcher's (a local rank inherits the "
            "launcher's whole environment):\n\n"
            + _table(("kind", "names"), [("names", ", ".join(_code(n) for n in FORWARD_NAMES)),
                                         ("prefixes", ", ".join(_code(p + "*") for p in FORWARD_PREFIXES)),
                                         ("and", "every `-x NAME[=VALUE]`")]))


def render_env_no_effect() -> str:
    from trainrun.horovod_no_effect import NO_EFFECT

    rows = [(_code(n + "*" if n.endswith("_") else n), v.for_variable()) for n, v in sorted(NO_EFFECT.items())]
    return _table(("variable", "why it has no effect (rank 0 says this once at init)"), rows)


# --- exit codes ---------------------------------------------------------------------------------------------------

def error_classes() -> list[type]:
    from trainrun import errors

    return [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.TrainrunError)]


def errors_doc_codes() -> list[tuple[str, str]]:
    """errors.py's docstring table: (code, meaning), continuation lines joined."""
    from trainrun import errors

    rows: list[list[str]] = []
    for line in (errors.__doc__ or "").splitlines():
        m = re.match(r"^    (\d+)\s+(.*)$", line)
        if m:
            rows.append([m.group(1), m.group(2)])
        elif rows and re.match(r"^\s{9,}\S", line):
            rows[-1][1] += " " + line.strip()
        elif rows and not line.strip():
            break
    return [(c, m) for c, m in rows]


def render_exit_codes() -> str:
    rows = [(_code(c), m) for c, m in errors_doc_codes()]
    classes = [(_code(c.__name__), _code(str(c.exit_code)) + (" (126 when not executable)" if c.__name__ == "ProgramError" else ""),
                " ".join((c.__doc__ or "").split())) for c in error_classes()]
    return (_table(("code", "meaning (errors.py)"), rows) + "\nThe error classes (`trainrun.errors`), each printed as one "
            "line `trainrun: error: ...`:\n\n" + _table(("class", "exit code", "what it is"), classes))


# --- Horovod API coverage -----------------------------------------------------------------------------------------

NAME_LISTS = (  # (Horovod module, trainrun module, test file, list variable(s), attribute path)
    ("horovod.torch", "trainrun.torch", "tests/runtime/test_torch_api.py", ("HOROVOD_TORCH",), ""),
    ("horovod.tensorflow", "trainrun.tensorflow", "tests/tensorflow/workers/tf_horovod.py", ("HOROVOD_TENSORFLOW",), ""),
    ("horovod.tensorflow.keras", "trainrun.tensorflow.keras", "tests/tensorflow/workers/tf_horovod.py",
     ("HOROVOD_TENSORFLOW_KERAS",), ""),
    ("horovod.keras", "trainrun.keras", "tests/tensorflow/workers/tf_horovod.py", ("HOROVOD_KERAS",), ""),
    ("horovod.tensorflow.keras.callbacks", "trainrun.tensorflow.keras", "tests/tensorflow/workers/tf_horovod.py",
     ("HOROVOD_CALLBACKS",), "callbacks"),
    ("horovod.keras.callbacks", "trainrun.keras", "tests/tensorflow/workers/tf_horovod.py", ("HOROVOD_CALLBACKS",), "callbacks"),
    ("horovod.ray", "trainrun.rayexec.horovod_api", "tests/ray/test_horovod_ray_names.py", ("HOROVOD_RAY",), ""),
    ("horovod.ray.RayExecutor", "trainrun.rayexec.horovod_api", "tests/ray/test_horovod_ray_names.py",
     ("HOROVOD_RAY_EXECUTOR",), "RayExecutor"),
    ("horovod.ray.ray_logger", "trainrun.rayexec.ray_logger", "tests/ray/test_horovod_ray_names.py",
     ("HOROVOD_RAY_LOGGER",), ""),
)


def horovod_names(test_file: str, variables: tuple[str, ...]) -> list[str]:
    """The names a public-name test lists (a module-level string of names, split), read without importing the test."""
    tree = ast.parse((REPO / test_file).read_text())
    out: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in variables:
            value = node.value
            if isinstance(value, ast.Call):  # """...""".split()
                value = value.func.value  # type: ignore[attr-defined]
            out += ast.literal_eval(value).split()
    return out


_CHECK = r"""
import importlib, json, sys
from trainrun.plan.horovod_shim import SHIM_DIR
sys.path.insert(0, SHIM_DIR)  # as in a rank: trainrun's `horovod` alias first on the path
first, lists = sys.argv[1], json.loads(sys.argv[2])
out = []


def missing_in(module, attr, names):
    m = importlib.import_module(module)
    m = getattr(m, attr) if attr else m
    gone = []
    for n in names:
        try:
            getattr(m, n)
        except Exception:
            gone.append(n)
    return gone


for module, alias, attr, names in lists:
    try:
        if first:
            importlib.import_module(first)
        out.append({"missing": missing_in(module, attr, names), "alias_missing": missing_in(alias, attr, names)})
    except Exception as err:  # TensorFlow or Keras not installed where the site is built
        out.append({"error": (type(err).__name__ + ": " + str(err)).splitlines()[0]})
print(json.dumps(out))
"""
# The public-name tests' processes: torch's imports trainrun.torch alone; TensorFlow's worker imports tensorflow
# first (so trainrun.keras runs on Keras's TensorFlow backend, where hvd.elastic exists), then the three modules.
_checks: dict[str, Any] = {}


def _group(mod: str) -> str:
    return "torch" if mod == "trainrun.torch" else "tensorflow"


def start_coverage() -> None:
    """Start the look-ups: one process for torch's names and one for TensorFlow's and Keras's, side by side
    (importing TensorFlow takes seconds: it runs while mkdocs reads the other pages)."""
    import json
    import os
    import subprocess
    import sys

    if _checks:
        return
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}
    for group, first in (("torch", ""), ("tensorflow", "tensorflow")):
        lists = [(mod, alias.removesuffix(f".{attr}") if attr else alias, attr, horovod_names(test_file, variables))
                 for alias, mod, test_file, variables, attr in NAME_LISTS if _group(mod) == group]
        _checks[group] = subprocess.Popen([sys.executable, "-c", _CHECK, first, json.dumps(lists)], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def horovod_coverage() -> list[tuple[str, str, list[str], list[str] | None, str]]:
    """(Horovod module, trainrun module, names, missing names or None when the module cannot be imported here, why).
    A name counts as present when both trainrun's module and the `horovod` alias a rank imports have it."""
    import json

    start_coverage()
    results: dict[str, list[dict[str, Any]]] = {}
    for group, proc in _checks.items():
        stdout, _ = proc.communicate(timeout=600)
        lines = stdout.strip().splitlines()
        results[group] = json.loads(lines[-1]) if lines else []
    out = []
    for horovod_mod, mod, test_file, variables, attr in NAME_LISTS:
        names = horovod_names(test_file, variables)
        group = results[_group(mod)]
        got = group.pop(0) if group else {"error": "the check did not answer"}
        where = mod + (f".{attr}" if attr else "")
        if "error" in got:
            out.append((horovod_mod, where, names, None, got["error"]))
        else:
            missing = got["missing"] + [n for n in got["alias_missing"] if n not in got["missing"]]
            out.append((horovod_mod, where, names, missing, test_file))
    return out


def render_horovod_api() -> str:
    parts = []
    for horovod_mod, mod, names, missing, note in horovod_coverage():
        if missing is None:
            status = f"Not checked where this site was built ({note})."
        else:
            status = f"**{len(names) - len(missing)} of {len(names)}** present" + \
                (f"; missing: {', '.join(missing)}" if missing else "") + f" (the names of `{note}`)."
        parts.append(f"### `{horovod_mod}` -> `{mod}`\n\n{status} Each name looked up in both `{mod}` and the `{horovod_mod}` alias a rank imports.\n\n" + ", ".join(_code(n) for n in names) + "\n")
    return "\n".join(parts)


def render_benchmark_pages() -> str:
    """A link to every page in docs/benchmarks/ with its title (a new page appears without an edit here)."""
    rows = []
    for page in sorted((REPO / "docs" / "benchmarks").glob("*.md")):
        if page.name == "index.md":
            continue
        title = next((line[2:].strip() for line in page.read_text().splitlines() if line.startswith("# ")), page.stem)
        rows.append(f"- [{page.stem}]({page.name}): {title}")
    return "\n".join(rows) + "\n"


RENDER = {
    "trainrun-options": render_trainrun_options,
    "horovodrun-options": render_horovodrun_options,
    "env-contract": lambda: render_env("contract"),
    "env-settings": lambda: render_env("settings"),
    "env-launcher": lambda: render_env("launcher"),
    "env-internal": lambda: render_env("internal"),
    "env-forwarded": render_env_forwarded,
    "env-no-effect": render_env_no_effect,
    "exit-codes": render_exit_codes,
    "horovod-api": render_horovod_api,
    "benchmark-pages": render_benchmark_pages,
}


def render(name: str) -> str:
    return RENDER[name]()


def expand(markdown: str) -> str:
    """`markdown` with every generated marker replaced by its Markdown. KeyError for an unknown name."""
    return MARKER.sub(lambda m: render(m.group(1)), markdown)


# --- the mkdocs hook ----------------------------------------------------------------------------------------------

def on_config(config: Any, **_: Any) -> Any:
    start_coverage()
    return config


def on_page_markdown(markdown: str, **_: Any) -> str:
    return expand(markdown)


if __name__ == "__main__":  # print one generated part: python scripts/docsgen.py trainrun-options
    import sys

    print(render(sys.argv[1]) if len(sys.argv) > 1 else "\n".join(RENDER))
