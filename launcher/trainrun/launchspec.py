"""The config boundary: the user's LaunchConfig, turned once into the narrow, typed, resolved specs that the
layers below the launch step take. Nothing below this step sees a LaunchConfig or calls back into config.py (its module).

    resolve(cfg, environ) -> LaunchSpec
        plan         plan/planner.PlanOptions       what planning reads; -x resolved against the environment here
        hosts        fanout/select.HostSource       the hosts, resolved once: -H, --hostfile, the discovery
                                                    script's first answer (it runs here, once) or a Slurm
                                                    allocation, less --exclude; the engine; why
        reach        fanout/select.ReachOptions     SSH options, --ssh-parallelism, --python
        nics         net/choice.NicOptions          --network-interface, --no-cache, the cache key
        supervision  supervisor/supervision.Supervision   every timeout (grace, start, hang, heartbeat, ssh,
                                                    and the one agent start-up slack), --tf-cluster's restarts
        output       supervisor/output.OutputOptions      --prefix, --output-dir, --fold, --ranks, --monitor, --json
        elastic      elasticjob/policy.ElasticSettings, or None for a launch with no elastic option

Every mode (a static launch, each elastic attempt, --mpi openmpi, --dry-run, --check, --tf-cluster) takes the
same LaunchSpec, so an option reaches the ranks the same way in each, or is refused once (config.py).
"""
from __future__ import annotations

from typing import Mapping, NamedTuple, TYPE_CHECKING

from trainrun.errors import UsageError
from trainrun.fanout.select import HostRequest, HostSource, ReachOptions, host_source
from trainrun.net.choice import NicOptions
from trainrun.plan.hosts import HostSpec
from trainrun.plan.planner import PlanOptions
from trainrun.supervisor.output import OutputOptions
from trainrun.supervisor.supervision import Supervision

if TYPE_CHECKING:
    from trainrun.config import LaunchConfig
    from trainrun.elasticjob.policy import ElasticSettings
    from trainrun.fanout.ray_engine import RayRequest


class LaunchSpec(NamedTuple):  # (not a dataclass: see plan/planner.py's note)
    """One launch, resolved. `given_hosts`: -H's or --hostfile's hosts as written (before --exclude; None when
    the hosts come from elsewhere), for `--check --perf`'s own launch of the collective benchmark. `mode`:
    "run", "dry-run" or "check". `discovery_script`: an elastic job's script, run again by the elastic loop."""

    plan: PlanOptions
    hosts: HostSource
    reach: ReachOptions
    nics: NicOptions
    supervision: Supervision
    output: OutputOptions
    elastic: ElasticSettings | None = None
    mode: str = "run"
    given_hosts: tuple[HostSpec, ...] | None = None
    discovery_script: str | None = None
    perf: bool = False
    perf_strict: bool = False
    perf_time: float | None = None


def resolve(cfg: LaunchConfig, environ: Mapping[str, str]) -> LaunchSpec:
    """The LaunchSpec of `cfg`, each part made once. Raises UsageError (one line, before any host is reached)
    for a bad or unset -x, a discovery script that fails or lists no host, --engine slurm outside an
    allocation, no host and no -np, or an --exclude that does not fit the hosts."""
    plan = plan_options(cfg, environ)
    reach = ReachOptions(ssh_port=cfg.ssh_port, ssh_identity_file=cfg.ssh_identity_file, ssh_config=cfg.ssh_config,
                         ssh_strict=cfg.ssh_strict, ssh_timeout=cfg.ssh_timeout, ssh_parallelism=cfg.ssh_parallelism,
                         python=cfg.python)
    return LaunchSpec(
        plan=plan, hosts=host_source(host_request(cfg), environ), reach=reach,
        nics=NicOptions(cfg.network_interface, cfg.no_cache, reach.cache_key),
        supervision=Supervision(grace=cfg.grace, hang_timeout=cfg.hang_timeout, heartbeat_timeout=cfg.heartbeat_timeout,
                                ssh_timeout=cfg.ssh_timeout, ps_restarts=cfg.ps_restarts,
                                **({"start_timeout": cfg.start_timeout} if cfg.start_timeout is not None else {})),
        output=OutputOptions(prefix=cfg.prefix, output_dir=cfg.output_dir, fold=cfg.fold, show_ranks=cfg.show_ranks,
                             monitor=cfg.monitor, json=cfg.json),
        elastic=elastic_settings(cfg), mode="check" if cfg.check else "dry-run" if cfg.dry_run else "run",
        given_hosts=cfg.hosts, discovery_script=cfg.host_discovery_script,
        perf=cfg.perf, perf_strict=cfg.perf_strict, perf_time=cfg.perf_time)


def elastic_settings(cfg: LaunchConfig) -> ElasticSettings | None:
    """The elastic settings of `cfg`, or None when it runs as a static job (no elastic option, or only
    --max-restarts 0). The policy module is imported only for an elastic option (import rule)."""
    if not cfg.elastic:
        return None
    from trainrun.elasticjob.policy import ElasticSettings

    settings = cfg.elastic_settings()
    assert isinstance(settings, ElasticSettings)  # (cfg.elastic: not the no-option placeholder)
    return settings if settings.enabled else None


def plan_options(cfg: LaunchConfig, environ: Mapping[str, str]) -> PlanOptions:
    """What planning reads of `cfg`; -x's variables taken from `environ` now (UsageError for an unset one)."""
    exports = tuple(cfg.exported_env(environ).items())
    return PlanOptions(command=cfg.command, num_proc=cfg.num_proc, tf_cluster=cfg.tf_cluster,
                       oversubscribe=cfg.oversubscribe, exclude=cfg.exclude, gpus_per_proc=cfg.gpus_per_proc,
                       allow_gpu_sharing=cfg.allow_gpu_sharing, python=cfg.python, workdir=cfg.workdir,
                       bind_to=cfg.bind_to, exports=exports, mpi=cfg.mpi)


def host_request(cfg: LaunchConfig) -> HostRequest:
    """The hosts as the user gave them; a --host-discovery-script runs here, the launch's one run of it before
    the elastic loop's (its first answer is the first attempt's hosts)."""
    local_np = cfg.num_proc or (cfg.tf_cluster.total if cfg.tf_cluster else None)
    if cfg.host_discovery_script:
        from trainrun.elasticjob.discovery import run_script

        given = tuple(run_script(cfg.host_discovery_script))
        if not given:
            raise UsageError(f"--host-discovery-script {cfg.host_discovery_script}: listed no host")
        return HostRequest(given, "--host-discovery-script", cfg.engine, cfg.exclude, local_np)
    flag = "--hostfile" if cfg.hostfile else "-H"
    return HostRequest(cfg.hosts, flag if cfg.hosts is not None else None, cfg.engine, cfg.exclude, local_np,
                       ray_request(cfg, local_np))


def ray_request(cfg: LaunchConfig, np: int | None) -> RayRequest | None:
    """--ray's placement (None without --ray): one bundle per rank of -np (config.py requires it)."""
    if cfg.ray is None:
        return None
    from trainrun.fanout.ray_engine import RayRequest

    return RayRequest(cfg.ray, cfg.ray_strategy, cfg.cpus_per_proc or 1.0, cfg.gpus_per_proc or 0,
                      np or cfg.max_np or 1, cfg.ssh_timeout)
