"""`horovod.ray`'s names (the shim module re-exports this one): Horovod 0.28.1's RayExecutor, the deprecated
ElasticRayExecutor and BaseHorovodWorker, over executor.py. Importing this imports no Ray (start() does).

The workers are the ranks of one trainrun launch (trainrun's Ray engine places them on the caller's Ray cluster
where this trainrun has it, else they run on this machine), each in a loop that keeps its executable_cls object
and its MPI world between calls. Differences from Horovod, each said where it applies: a call that raises on a
rank ends the executor's ranks (fail fast; the call raises trainrun.RankError naming the rank, later calls
RunError until start() again); `settings.discovery` of your own (override_discovery=False), a current placement
group (use_current_placement_group) and ssh settings have no effect; elastic executors take no executable_cls
state between calls (as Horovod's)."""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

from trainrun.rayexec import ray_logger

__all__ = ["RayExecutor", "BaseHorovodWorker", "ElasticRayExecutor", "ray_logger"]


@dataclass
class MiniSettings:
    """Horovod's settings for a RayExecutor: `timeout_s` (seconds for every rank to join the MPI world:
    trainrun's --start-timeout), `nics` (trainrun's --network-interface); the others are accepted and unused."""

    nics: Any = None
    verbose: int = 1
    key: Any = None
    ssh_port: Any = None
    ssh_identity_file: Any = None
    timeout_s: int = 300
    placement_group_timeout_s: int = 100
    elastic: bool = False
    discovery: Any = None
    min_num_proc: int | None = None
    max_num_proc: int | None = None
    reset_limit: int | None = None
    elastic_timeout: int | None = None
    cooldown_range: Any = None


def _settings_argv(settings) -> list[str]:
    argv: list[str] = []
    timeout = getattr(settings, "timeout_s", None)
    if timeout:
        argv += ["--start-timeout", str(int(timeout))]
    nics = getattr(settings, "nics", None)
    if nics:
        argv += ["--network-interface", nics if isinstance(nics, str) else ",".join(sorted(nics))]
    return argv


class BaseHorovodWorker:
    """Horovod's worker actor class, for programs that name it. Here an executable_cls is made inside each rank
    (worker.py), and `execute(fn)` hands fn that object; this class is only the base a program may subclass."""

    executable = None

    def __init__(self, world_rank: int = 0, world_size: int = 1):
        os.environ.setdefault("HOROVOD_RANK", str(world_rank))
        os.environ.setdefault("HOROVOD_SIZE", str(world_size))

    def hostname(self) -> str:
        import socket

        return socket.gethostname()

    def env_vars(self) -> dict:
        return dict(os.environ)

    def update_env_vars(self, env_vars: dict) -> None:
        os.environ.update({k: str(v) for k, v in env_vars.items()})

    def execute(self, func):
        return func(self.executable)


class RayExecutor:
    """Horovod's RayExecutor: `RayExecutor(settings, num_workers=2).start(); .run(fn); .shutdown()`."""

    @classmethod
    def create_settings(cls, timeout_s=30, ssh_identity_file=None, ssh_str=None, placement_group_timeout_s=100,
                        nics=None) -> MiniSettings:
        """Horovod's settings object (ssh_identity_file/ssh_str are not used: trainrun reaches the ranks
        through Ray; ssh_str is not written to disk)."""
        return MiniSettings(ssh_identity_file=ssh_identity_file, timeout_s=timeout_s,
                            placement_group_timeout_s=placement_group_timeout_s, nics=nics)

    def __init__(self, settings, num_workers: int | None = None, num_hosts: int | None = None,
                 num_workers_per_host: int = 1, cpus_per_worker: int = 1, use_gpu: bool = False,
                 gpus_per_worker: int | None = None, use_current_placement_group: bool = True,
                 min_workers: int | None = None, max_workers: int | None = None, reset_limit: int | None = None,
                 cooldown_range=None, elastic_timeout: int = 600, override_discovery: bool = True):
        from trainrun.rayexec.executor import Elastic, Executor, Placement

        if max_workers and (not min_workers or min_workers <= 0):
            raise ValueError("`max_workers` provided without any positive `min_workers`"
                             "Elastic workloads require a positive `min_workers`")
        if min_workers and num_workers:
            raise ValueError("Both `min_workers` and `num_workers` provided."
                             "Only one of the above is allowed as workloads cannot be elastic and non-elastic.")
        if not override_discovery:
            warnings.warn("horovod.ray (trainrun): override_discovery=False has no effect; the elastic launch "
                          "finds its slots itself", stacklevel=2)
        gpus = (gpus_per_worker or 1) if use_gpu else 0
        elastic = None
        if min_workers is not None:
            size = min_workers
            elastic = Elastic(min_np=min_workers, max_np=max_workers, max_restarts=reset_limit,
                              cooldown=tuple(cooldown_range) if cooldown_range else None, timeout=elastic_timeout)
        elif num_workers is not None:
            size = num_workers
        elif num_hosts is not None:
            size = num_hosts * num_workers_per_host
        else:
            raise ValueError("RayExecutor: give num_workers (or num_hosts and num_workers_per_host, or min_workers "
                             "for an elastic job)")
        if size < 1:
            raise ValueError(f"RayExecutor: {size} workers: give at least 1")
        self.settings = settings
        settings.elastic = elastic is not None
        place = Placement(size=size, cpus=cpus_per_worker, gpus=gpus,
                          hosts=num_hosts if num_workers is None and elastic is None else None)
        self._executor = Executor(place, elastic, extra_argv=_settings_argv(settings))

    def start(self, executable_cls: type | None = None, executable_args: list | None = None,
              executable_kwargs: dict | None = None, extra_env_vars: dict | None = None) -> None:
        """Start the workers; each makes `executable_cls(*executable_args, **executable_kwargs)` (if given)
        with `extra_env_vars` in its environment."""
        self._executor.start(executable_cls, executable_args, executable_kwargs, extra_env_vars)

    def execute(self, fn, callbacks: list | None = None) -> list:
        """`fn(executable)` on every worker; the values in rank order."""
        return self._executor.execute(fn, callbacks)

    def run(self, fn, args: list | None = None, kwargs: dict | None = None, callbacks: list | None = None) -> list:
        """`fn(*args, **kwargs)` on every worker; the values in rank order. `callbacks` get each record that
        rank code sends with `horovod.ray.ray_logger.log`, in the caller."""
        return self._executor.run(fn, args, kwargs, callbacks)

    def run_remote(self, fn, args: list | None = None, kwargs: dict | None = None) -> list:
        """As run(), but at once: a list of ObjectRefs, one per worker (`ray.get` them)."""
        return self._executor.run_remote(fn, args, kwargs)

    def execute_single(self, fn):
        """`fn(executable)` on the rank 0 worker; its value."""
        return self._executor.execute_single(fn)

    def shutdown(self) -> None:
        """End the workers; nothing of this executor is left (ranks, launcher, its Ray actor)."""
        self._executor.shutdown()


class ElasticRayExecutor:
    """Horovod's deprecated ElasticRayExecutor (0.25): `create_settings(min_num_proc=..., max_num_proc=...)`,
    then `start()` and `run(fn, callbacks=...)`: a RayExecutor with min_workers/max_workers."""

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: int | None = None, reset_limit: int | None = None,
                        elastic_timeout: int = 600, timeout_s: int = 30, ssh_identity_file=None, nics=None,
                        min_np=None, max_np=None, **kwargs) -> MiniSettings:
        if min_np is not None:
            min_num_proc = min_np
            warnings.warn("min_np is deprecated, use min_num_proc instead", DeprecationWarning, stacklevel=2)
        if max_np is not None:
            max_num_proc = max_np
            warnings.warn("max_np is deprecated, use max_num_proc instead", DeprecationWarning, stacklevel=2)
        return MiniSettings(nics=nics, timeout_s=timeout_s, ssh_identity_file=ssh_identity_file, elastic=True,
                            min_num_proc=min_num_proc, max_num_proc=max_num_proc, reset_limit=reset_limit,
                            elastic_timeout=elastic_timeout, cooldown_range=kwargs.get("cooldown_range"),
                            verbose=kwargs.get("verbose", 1))

    def __init__(self, settings, use_gpu: bool = False, cpus_per_slot: int = 1, gpus_per_slot: int | None = None,
                 env_vars: dict | None = None, override_discovery: bool = True):
        if gpus_per_slot and not use_gpu:
            raise ValueError("gpus_per_slot is set, but use_gpu is False. use_gpu must be True if gpus_per_slot is set. ")
        self.settings = settings
        self.env_vars = env_vars or {}
        self._executor = RayExecutor(settings, min_workers=settings.min_num_proc or 1, max_workers=settings.max_num_proc,
                                     reset_limit=settings.reset_limit, cooldown_range=settings.cooldown_range,
                                     elastic_timeout=settings.elastic_timeout or 600, cpus_per_worker=cpus_per_slot,
                                     use_gpu=use_gpu, gpus_per_worker=gpus_per_slot,
                                     override_discovery=override_discovery)

    def start(self) -> None:
        self._executor.start(extra_env_vars=self.env_vars)

    def run(self, worker_fn, callbacks: list | None = None) -> list:
        """`worker_fn()` on the ranks of one elastic launch; the last attempt's values in rank order."""
        try:
            return self._executor.run(worker_fn, callbacks=callbacks)
        finally:
            self._executor.shutdown()
