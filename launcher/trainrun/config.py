"""LaunchConfig: every launch option as one typed, validated value; and YAML config files.

The user's strings are parsed here, once (`parse_config`): `-H` and `--hostfile` into HostSpecs, `--exclude`
into an Exclusion, `--network-interface` into NIC names, `--ranks` into a rank set, `-x` into (name, value)
pairs. LaunchConfig holds only such typed values (paths and program words aside), so no later layer parses
an option again. It runs nothing: the launch step (launchspec.resolve) turns it once into the narrow specs
the layers below take (the discovery script is run there), and no layer below that sees a LaunchConfig.

A `--config FILE.yaml` may set any option by its CLI name (`np`, `hosts`, `grace`, `output-dir`,
`x`, ... with dashes or underscores); the command line overrides the file. Keys are checked against
the CLI's own options and values converted by the CLI's own types, so the file and the flags can
never disagree about what is valid.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

from trainrun.errors import UsageError
from trainrun.plan.hosts import Exclusion, HostSpec, parse_exclude, parse_hosts_arg, read_hostfile
from trainrun.plan.roles import RoleCounts

if TYPE_CHECKING:
    import click  # (imported where a YAML config is read: a plain launch reads its line without click, cli/simple.py)

    from trainrun.elasticjob.policy import ElasticSettings

Export = tuple[str, "str | None"]  # -x NAME=VALUE -> (NAME, VALUE); -x NAME -> (NAME, None): the launcher's value


class _NotElastic:
    """elastic_settings() of a launch with no elastic option."""

    enabled = False

    def to_json(self) -> dict[str, object]:
        return {}

    def describe(self) -> str:
        return ""


NOT_ELASTIC = _NotElastic()


@dataclass(frozen=True)
class LaunchConfig:
    """Every launch option, typed and validated (parse_config makes it; launchspec.resolve reads it)."""

    command: tuple[str, ...]
    num_proc: int | None = None
    hosts: tuple[HostSpec, ...] | None = None  # -H's hosts, or --hostfile's (read by parse_config)
    hostfile: str | None = None  # the path --hostfile named (for messages: the hosts are in `hosts`)
    oversubscribe: bool = False
    gpus_per_proc: int | None = None
    allow_gpu_sharing: bool = False
    bind_to: Literal["none", "core"] = "none"
    export: tuple[Export, ...] = ()
    horovod: str | None = None  # --horovod: trainrun | installed (None: TRAINRUN_HOROVOD, else trainrun)
    prefix: str = "rank"
    output_dir: str | None = None
    fold: bool = False
    monitor: bool = False
    show_ranks: frozenset[int] | None = None  # --ranks (None: every rank's output)
    hang_timeout: float | None = None
    grace: float = 3.0
    mpi: str = "mpich"
    start_timeout: float | None = None  # None: supervisor/supervision.Supervision's default (120 s)
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    ssh_config: str | None = None
    ssh_strict: bool = False
    ssh_timeout: float = 15.0
    ssh_parallelism: int = 64
    heartbeat_timeout: float = 15.0
    python: str | None = None
    workdir: str | None = None
    network_interface: tuple[str, ...] = ()  # --network-interface's NICs (): the probe chooses
    no_cache: bool = False
    max_restarts: int | None = None
    min_np: int | None = None
    max_np: int | None = None
    host_discovery_script: str | None = None
    blacklist_cooldown_range: tuple[float, float] | None = None
    elastic_timeout: float = 600.0
    warm_ranks: bool = True  # elastic: spare interpreters per rank for restarts (elasticjob/spares.py)
    max_backoff: float = 10.0  # elastic: the back-off's cap (restart_policy.DEFAULT_MAX_BACKOFF says why)
    check: bool = False
    perf: bool = False
    perf_strict: bool = False
    perf_time: float | None = None
    exclude: Exclusion = Exclusion()
    dry_run: bool = False
    json: bool = False
    verbose: bool = False
    engine: str = "auto"
    tf_cluster: RoleCounts | None = None  # --tf-cluster: a TensorFlow parameter-server cluster (plan/roles.py)
    ray: str | None = None  # --ray [ADDRESS]: Ray places the ranks (fanout/ray_engine.py); "auto": RAY_ADDRESS or local
    ray_strategy: str = "pack"
    cpus_per_proc: float | None = None  # --ray: each rank's CPUs in its bundle (None: 1)

    def __post_init__(self) -> None:
        if self.host_discovery_script and self.hosts is not None:
            raise UsageError("--host-discovery-script and -H/--hostfile both given; the script lists the hosts, use one of them")
        self._check_elastic()
        self._check_tf_cluster()
        if self.monitor and (self.dry_run or self.check):
            raise UsageError("--monitor shows a running job; it does not go with --dry-run or --check")
        if (self.perf_strict or self.perf_time is not None) and not self.perf:
            raise UsageError("--perf-strict and --perf-time go with --perf; write --check --perf --perf-strict")
        if self.perf and not self.check:
            raise UsageError("--perf goes with --check; write trainrun -H ... --check --perf")
        self._check_openmpi()
        self._check_ray()

    def _check_ray(self) -> None:
        """--ray's refusals, one line each: Ray gives the hosts, so nothing else may; the modes that reach no
        host or run no job do not place a placement group."""
        if self.ray is None:
            if self.ray_strategy != "pack" or self.cpus_per_proc is not None:
                raise UsageError("--ray-strategy and --cpus-per-proc go with --ray (Ray's placement of the ranks)")
            return
        if not looks_like_ray_address(self.ray):
            raise UsageError(f"--ray {self.ray}: not a Ray address (auto, HOST:PORT or ray://HOST:PORT); to use the "
                             f"default address put --ray before another option, e.g. trainrun --ray -np 4 {self.ray}")
        if self.hosts is not None or self.host_discovery_script:
            raise UsageError("--ray with -H/--hostfile/--host-discovery-script: Ray places the ranks and so picks "
                             "the hosts; drop one of them")
        if self.engine != "auto":
            raise UsageError(f"--ray with --engine {self.engine}: the Ray engine reaches the hosts; drop --engine")
        if self.mpi == "openmpi":
            raise UsageError("--ray with --mpi openmpi: mpirun would start the ranks outside Ray's bundles; use "
                             "--mpi mpich (trainrun serves the MPI world)")
        if self.check:
            raise UsageError("--check with --ray is not supported yet: the ranks' hosts exist only once Ray has "
                             "placed them; run `ray status` for the cluster, or --check with -H")
        if self.dry_run:
            raise UsageError("--dry-run with --ray is not supported: the plan depends on where Ray places the ranks, "
                             "which happens only at launch")
        if self.num_proc is None and self.max_np is None and self.tf_cluster is None:
            raise UsageError("--ray needs -np N (how many bundles to ask Ray for)")

    def _check_openmpi(self) -> None:
        """The options `--mpi openmpi` cannot honour, refused (each one line): what they watch does not reach
        trainrun through mpirun (the ranks' diag pipe, their PMI joins)."""
        if self.mpi != "openmpi":
            return
        if self.hang_timeout is not None:
            raise UsageError("--hang-timeout with --mpi openmpi: the ranks' progress does not reach trainrun through "
                             "mpirun, so a rank training without output would be taken for hung; use --mpi mpich")
        if self.start_timeout is not None:
            raise UsageError("--start-timeout with --mpi openmpi: the MPI world forms inside mpirun, where trainrun "
                             "cannot time it; drop --start-timeout or use --mpi mpich")
        if self.monitor or (self.json and not (self.dry_run or self.check)):
            raise UsageError("--monitor/--json with --mpi openmpi: the ranks' step counters do not reach trainrun "
                             "through mpirun; use --mpi mpich")

    def _check_elastic(self) -> None:
        lo, hi, np = self.min_np, self.max_np, self.num_proc
        if lo is not None and hi is not None and lo > hi:
            raise UsageError(f"--min-np {lo} is more than --max-np {hi}")
        if np is not None and lo is not None and lo > np:
            raise UsageError(f"--min-np {lo} is more than -np {np}; -np is the size the job starts with")
        if np is not None and hi is not None and hi < np:
            raise UsageError(f"--max-np {hi} is less than -np {np}; -np is the size the job starts with")
        rng = self.blacklist_cooldown_range
        if rng is not None and not 0 <= rng[0] <= rng[1]:
            raise UsageError(f"--blacklist-cooldown-range {rng[0]:g} {rng[1]:g}: expected 0 <= MIN <= MAX seconds")
        if self.mpi == "openmpi" and self.elastic_settings().enabled:
            raise UsageError("--mpi openmpi cannot restart or resize a job (mpirun owns the ranks); use --mpi mpich")

    def _check_tf_cluster(self) -> None:
        if self.tf_cluster is None:
            return
        if self.mpi == "openmpi":
            raise UsageError("--tf-cluster with --mpi openmpi: a parameter-server cluster has no MPI world (its tasks "
                             "are TensorFlow servers); drop --mpi openmpi")
        if self.min_np is not None or self.max_np is not None or self.host_discovery_script is not None:
            raise UsageError("--tf-cluster with --min-np/--max-np/--host-discovery-script: a parameter-server cluster "
                             "keeps its size (a dead worker is restarted, up to --max-restarts)")

    @property
    def ps_restarts(self) -> int:
        """--tf-cluster: how often each worker task may be restarted (--max-restarts, default 3)."""
        return 3 if self.max_restarts is None else self.max_restarts

    @property
    def elastic(self) -> bool:
        """Any elastic option given (--max-restarts, --min-np, --max-np, --host-discovery-script). With
        --tf-cluster, --max-restarts is the worker restart limit instead (supervisor/ps_policy.py)."""
        return ((self.max_restarts is not None and self.tf_cluster is None) or self.min_np is not None
                or self.max_np is not None or self.host_discovery_script is not None)

    def elastic_settings(self) -> ElasticSettings | _NotElastic:
        """The elastic options as one ElasticSettings (elasticjob/policy.py). --max-restarts defaults to 0,
        or to no limit with elastic sizing (--min-np / --max-np / --host-discovery-script). Built once per
        launch, by the launch step (launchspec.resolve), which hands it down."""
        if not self.elastic:
            return NOT_ELASTIC  # the usual launch: no policy module (and its dataclasses) on the start-up path
        from trainrun.elasticjob.policy import ElasticSettings

        sizing = self.min_np is not None or self.max_np is not None or self.host_discovery_script is not None
        restarts = self.max_restarts if self.max_restarts is not None else (None if sizing else 0)
        min_np = self.min_np if self.min_np is not None else (1 if sizing else None)
        return ElasticSettings(restarts, min_np, self.max_np, self.host_discovery_script,
                               self.blacklist_cooldown_range,
                               self.elastic_timeout, self.warm_ranks, self.max_backoff)

    def exported_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """`-x NAME=VALUE` and `-x NAME` (value taken from the launcher's environment), and TRAINRUN_HOROVOD
        (--horovod, else the launcher's or -x's TRAINRUN_HOROVOD, else trainrun; UsageError for another value).
        Called once per launch, by the launch step (launchspec.plan_options), which hands the result down."""
        out = {}
        for name, given in self.export:
            if given is None:
                if name not in environ:
                    raise UsageError(f"-x {name}: not set in the launcher's environment; write -x {name}=VALUE")
                given = environ[name]
            out[name] = given
        from trainrun.plan.horovod_shim import VARIABLE, choice

        try:  # every rank's env says which `horovod` it imports (--dry-run shows it; supervisor/local.py acts on it)
            out[VARIABLE] = choice({**environ, **out}, self.horovod)
        except ValueError as e:
            raise UsageError(str(e)) from None
        return out


def parse_config(command: Sequence[str], *, hosts: str | None = None, hostfile: str | None = None,
                 exclude: str | None = None, network_interface: str | None = None, show_ranks: str | None = None,
                 export: Sequence[str] = (), **typed: Any) -> LaunchConfig:
    """The one place the user's option strings become typed values (argv and YAML alike, and trainrun.run's
    options): -H / --hostfile (the file is read here), --exclude, --network-interface, --ranks, -x. `typed`:
    the options click has already converted (numbers, choices, flags, paths). Raises UsageError (one line)."""
    if hosts and hostfile:
        raise UsageError("-H and --hostfile both given; use one of them")
    if typed.get("host_discovery_script") and (hosts or hostfile):
        raise UsageError("--host-discovery-script and -H/--hostfile both given; the script lists the hosts, use one of them")
    specs = tuple(parse_hosts_arg(hosts)) if hosts else tuple(read_hostfile(hostfile)) if hostfile else None
    return LaunchConfig(command=tuple(command), hosts=specs, hostfile=hostfile or None,
                        exclude=parse_exclude(exclude), network_interface=parse_nics(network_interface),
                        show_ranks=_parse_shown(show_ranks), export=tuple(parse_export(x) for x in export), **typed)


def looks_like_ray_address(text: str) -> bool:
    """A Ray address as ray.init takes it: auto, local, HOST:PORT, or a scheme such as ray://HOST:PORT."""
    return text in ("auto", "local") or "://" in text or (":" in text and text.rsplit(":", 1)[1].isdigit())


def parse_nics(text: str | None) -> tuple[str, ...]:
    """`--network-interface eth0[,eth1]` -> the NIC names; UsageError for an empty entry or a name Linux
    cannot have (at most 15 characters, no '/' or blank)."""
    if not text:
        return ()
    names = tuple(n.strip() for n in text.split(","))
    for name in names:
        if not name or len(name) > 15 or any(c in name for c in "/ \t") or name in (".", ".."):
            raise UsageError(f"--network-interface {text}: '{name}' is not a NIC name; write e.g. --network-interface eth0,eth1")
    return names


def _parse_shown(text: str | None) -> frozenset[int] | None:
    if text is None:
        return None
    from trainrun.rankset import parse_ranks

    try:
        return parse_ranks(text)
    except ValueError as err:
        raise UsageError(f"--ranks {text}: {err}") from None


def parse_export(item: str) -> Export:
    """`-x NAME=VALUE` -> (NAME, VALUE); `-x NAME` -> (NAME, None). UsageError for a name no variable has."""
    name, sep, value = item.partition("=")
    if not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
        raise UsageError(f"-x {item}: '{name}' is not a variable name; write -x NAME=VALUE or -x NAME")
    return name, value if sep else None


def _aliases(command: click.Command) -> dict[str, click.Parameter]:
    import click

    out: dict[str, click.Parameter] = {}
    for p in command.params:
        if not isinstance(p, click.Option) or p.name is None or p.name in ("config", "version", "help"):
            continue
        out[p.name] = p
        for opt in p.opts:
            key = opt.lstrip("-")
            out[key] = out[key.replace("-", "_")] = p
    return out


MAX_CONFIG_BYTES = 1024 * 1024
"""The most bytes of a YAML config (`--config`, horovodrun's `--config-file`), and the most characters of text
its values may hold once aliases are expanded. A config is an option per line and perhaps a host list:
kilobytes. Bigger is the wrong file, and is refused before it is parsed."""

MAX_CONFIG_NODES = 20_000
"""The most values (scalars, lists, mappings) a YAML config may hold, aliases counted each time they are used.
Beyond any list of options and hosts (a longer host list belongs in a --hostfile); PyYAML composes them in
about 0.4 s. With MAX_CONFIG_BYTES it bounds what aliases expand to: `&a [x, x], &b [*a, *a], ...` doubles per
line, and every later use of the value (str(), join) would walk the expansion."""

MAX_CONFIG_DEPTH = 64
"""The deepest nesting of lists and mappings in a YAML config (PyYAML composes recursively: `[[[[...` would
end in a RecursionError's traceback). A config nests two levels."""


class _ConfigTooBig(Exception):
    """A YAML config past a bound (what, and where: the PyYAML mark)."""

    def __init__(self, problem: str, mark: Any):
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


def _bounded_loader(text: str) -> Any:
    """A yaml.SafeLoader over `text` that counts the values it composes, each alias as the whole value it names
    (nodes and text), and their depth; past MAX_CONFIG_NODES, MAX_CONFIG_BYTES or MAX_CONFIG_DEPTH it raises
    _ConfigTooBig while composing, before any alias is expanded into Python objects."""
    import yaml

    class Loader(yaml.SafeLoader):  # type: ignore[misc]  # yaml is untyped here (pyproject: ignore_missing_imports)
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.nodes = self.chars = self.depth = 0
            self.sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (nodes, chars) it expands to

        def count(self, nodes: int, chars: int) -> None:
            self.nodes += nodes
            self.chars += chars
            if self.nodes > MAX_CONFIG_NODES:
                raise _ConfigTooBig(f"more than {MAX_CONFIG_NODES} values (aliases counted each time they are used)",
                                    self.get_mark())
            if self.chars > MAX_CONFIG_BYTES:
                raise _ConfigTooBig(f"values hold more than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB of text "
                                    "(aliases counted each time they are used)", self.get_mark())

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                node = super().compose_node(parent, index)
                size = self.sizes.get(id(node))
                if size is None:  # the anchor's own value is still being composed
                    raise _ConfigTooBig("an alias inside the value it names (a value that contains itself)", self.get_mark())
                self.count(*size)
                return node
            self.depth += 1
            if self.depth > MAX_CONFIG_DEPTH:
                raise _ConfigTooBig(f"lists or mappings nested more than {MAX_CONFIG_DEPTH} deep", self.get_mark())
            nodes, chars = self.nodes, self.chars
            node = super().compose_node(parent, index)
            self.depth -= 1
            self.count(1, len(node.value) if isinstance(node, yaml.ScalarNode) else 0)
            self.sizes[id(node)] = (self.nodes - nodes, self.chars - chars)
            return node

    return Loader(text)


def read_yaml_config(path: str, flag: str) -> Any:
    """The YAML document in `path` (None when empty), read within bounds: MAX_CONFIG_BYTES of UTF-8 text, at
    most MAX_CONFIG_NODES values (aliases expanded) MAX_CONFIG_DEPTH deep. `flag` (`--config`) names the option
    in messages. Raises UsageError, one line naming the file (and its line where one is to blame)."""
    import yaml

    where = f"{flag} {path}"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{where}: is a directory, not a YAML file") from None
    except OSError as err:
        raise UsageError(f"{where}: cannot read it ({err.strerror})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise UsageError(f"{where}: more than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB; a config is a mapping of "
                         "option: value (a long host list belongs in a --hostfile)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise UsageError(f"{where}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x}); save it as UTF-8") from None
    loader = _bounded_loader(text)
    try:
        return loader.get_single_data()
    except _ConfigTooBig as err:
        raise UsageError(f"{where}:{err.problem_mark.line + 1}: {err.problem}; a config is a small mapping of "
                         "option: value") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = " ".join(str(getattr(err, "problem", None) or err).split())  # one line (a ReaderError has two)
        raise UsageError(f"{where}{f':{mark.line + 1}' if mark else ''}: not valid YAML ({problem})") from None
    finally:
        loader.dispose()


def load_config_file(path: str, ctx: click.Context) -> dict[str, Any]:
    """Read a YAML config (read_yaml_config: bounded) into click's default_map form ({param name: converted value})."""
    import click

    doc = read_yaml_config(path, "--config")
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: expected a mapping of option: value, got {type(doc).__name__}")
    aliases = _aliases(ctx.command)
    out = {}
    for key, value in doc.items():
        param = aliases.get(str(key))
        if param is None:
            raise UsageError(f"{path}: unknown key '{key}'; keys are the long option names, e.g. np, hosts, grace, output-dir")
        if param.name == "hosts" and isinstance(value, list):
            value = ",".join(map(str, value))
        if param.name == "tf_cluster" and isinstance(value, dict):  # tf-cluster: {chief: 1, worker: 4, ps: 2}
            value = ",".join(f"{k}={v}" for k, v in value.items())
        if param.multiple and not isinstance(value, list):
            value = [value]
        if param.multiple and any(isinstance(v, (list, dict)) for v in value):
            raise UsageError(f"{path}: key '{key}': expected a list of plain values, e.g. [A=1, B=2]")
        if not param.multiple and isinstance(value, (list, dict)):
            raise UsageError(f"{path}: key '{key}': expected a single value, got a {type(value).__name__}")
        try:
            out[param.name] = param.type_cast_value(ctx, value)
        except click.BadParameter as err:
            raise UsageError(f"{path}: key '{key}': {err.message}") from None
    return out
