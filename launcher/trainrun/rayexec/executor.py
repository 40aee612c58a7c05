"""The caller's side of `horovod.ray.RayExecutor`: its ranks are one trainrun launch, started by start() as a
child process (as trainrun.run's are: PR_SET_PDEATHSIG, the launcher's output passed on to sys.stdout/stderr)
and ended by shutdown(). Each rank runs worker.py's loop; the commands and outcomes go through the executor's
mailbox actor (mailbox.py) in the caller's Ray cluster.

Where the ranks run: trainrun's Ray engine (`trainrun --ray ADDRESS`, ADDRESS the caller's cluster) places them
on its nodes, a bundle of the executor's CPUs/GPUs each, and runs them under the nodes' agents; each rank joins
the cluster (`ray.init(address=...)`, with the caller's token settings) to reach the mailbox.

A rank whose call raised ends (fail fast, as trainrun.run's): the call raises RankError naming the rank(s),
and the executor's ranks are gone, so a later call raises RunError until start() runs again. A rank that dies
ends the launch; the launcher's end fails every call waiting on the mailbox, with the launcher's last words.
Elastic executors (min_workers) run each run() as one elastic trainrun.run launch (`--min-np`/`--max-np`):
nothing stays between calls there, as in Horovod."""
from __future__ import annotations

import os
import secrets
import signal
import sys
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from trainrun.rayexec.worker import ENV_ADDRESS, ENV_MAILBOX

STOP_GRACE_S = 30.0
RAY_AUTH = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")  # how this process joined its cluster


@dataclass
class Placement:
    """How many ranks and what each takes: `size` ranks, `cpus`/`gpus` each; `hosts`: spread over exactly
    that many nodes (num_hosts), else anywhere."""

    size: int
    cpus: float = 1
    gpus: float = 0
    hosts: int | None = None


@dataclass
class Elastic:
    min_np: int
    max_np: int | None = None
    max_restarts: int | None = None
    cooldown: tuple[int, int] | None = None
    timeout: float | None = None


@dataclass
class _Launch:
    proc_code: list = field(default_factory=list)
    tail: list = field(default_factory=list)
    thread: threading.Thread | None = None


def _ray():
    import ray

    if not ray.is_initialized():
        ray.init()
    return ray


def engine_argv(place: Placement, address: str) -> list[str]:
    """The launch options that place `place`'s ranks with trainrun's Ray engine (`trainrun --ray`): a bundle of
    `cpus`/`gpus` per rank; with `hosts` (Horovod's num_hosts) Ray's STRICT_SPREAD when that is one rank per
    node, else SPREAD (Ray has no "k per node on exactly n nodes" for one bundle per rank). Pure."""
    argv = ["--ray", address, "-np", str(place.size), "--cpus-per-proc", f"{place.cpus:g}"]
    if place.gpus:
        argv += ["--gpus-per-proc", str(int(place.gpus))]
    if place.hosts:
        argv += ["--ray-strategy", "strict_spread" if place.hosts == place.size else "spread"]
    return argv


LOCAL_RESTARTS = 3


def elastic_argv(place: Placement, e: Elastic, address: str, nodes: int, slots: int) -> list[str]:
    """The launch options of an elastic executor's run() on a cluster of `nodes` nodes with room for `slots`
    ranks (its CPUs, or GPUs, by the rank's share): `-np` as many as fit between min_workers and max_workers
    (Horovod's discovery counts the same slots), trainrun's elastic sizing (`--min-np`/`--max-np`; reset_limit
    is --max-restarts; the cooldown range, the elastic timeout). On a one-node cluster a failing rank would make
    that node sit out with nowhere to go, so there the ranks are restarted in place instead, up to reset_limit
    times (LOCAL_RESTARTS when None). Pure."""
    size = max(e.min_np, min(e.max_np or e.min_np, slots)) if e.max_np else e.min_np
    argv = engine_argv(replace(place, size=size), address)
    if nodes <= 1:
        return argv + ["--max-restarts", str(LOCAL_RESTARTS if e.max_restarts is None else e.max_restarts)]
    argv += ["--min-np", str(e.min_np)]
    if e.max_np:
        argv += ["--max-np", str(e.max_np)]
    if e.max_restarts is not None:
        argv += ["--max-restarts", str(e.max_restarts)]
    if e.cooldown:
        argv += ["--blacklist-cooldown-range", *map(str, e.cooldown)]
    if e.timeout is not None:
        argv += ["--elastic-timeout", str(e.timeout)]
    return argv


class Executor:
    """One RayExecutor's ranks. start() -> run()/execute()/execute_single()/run_remote() ... -> shutdown()."""

    def __init__(self, place: Placement, elastic: Elastic | None = None, *, extra_argv: list[str] | None = None,
                 executable: str | None = None):
        self.place, self.elastic = place, elastic
        self.extra_argv = list(extra_argv or [])
        self.executable = executable
        self.box: Any = None
        self.name = ""
        self._launch: _Launch | None = None
        self._closing = False
        self._log_seen = 0
        self._elastic_cls: tuple | None = None
        self._env: dict[str, str] = {}

    # -- life

    def start(self, executable_cls=None, executable_args=None, executable_kwargs=None,
              extra_env_vars: dict | None = None) -> None:
        """Start the ranks (static) and make `executable_cls(*args, **kwargs)` in each; return once every rank
        has made it. Elastic: only remember them (each run() starts its own ranks)."""
        import ray.util.client

        from trainrun.errors import UsageError

        if ray.util.client.ray.is_connected():
            raise UsageError("RayExecutor: a Ray client driver (ray.init('ray://...')) is not supported: the workers' "
                             "launcher must run on a node of the cluster; run this driver there (ray.init('auto'))")
        ray = _ray()
        if self.box is not None:
            raise RuntimeError("RayExecutor.start(): already started; call shutdown() first")
        self._env = {str(k): str(v) for k, v in (extra_env_vars or {}).items()}
        self.name = f"trainrun-rayexec-{secrets.token_hex(8)}"
        box_cls = ray.remote(num_cpus=0)(_mailbox_class())
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.box = box_cls.options(name=self.name, namespace=self.name, scheduling_strategy=here).remote(self.place.size)
        self._log_seen = 0
        if self.elastic is not None:
            self._elastic_cls = (executable_cls, tuple(executable_args or ()), dict(executable_kwargs or {}))
            return
        self._closing = False
        self._spawn(ray)
        self._call(("start", executable_cls, tuple(executable_args or ()), dict(executable_kwargs or {})))

    def _spawn(self, ray) -> None:
        from trainrun.runfunc.api import _supervise, check_argv
        from trainrun.wire.runfunc_lines import Collector

        address = ray.get_runtime_context().gcs_address
        exports = self._exports(address)
        options = engine_argv(self.place, address) + self.extra_argv + self._export_argv(exports)
        check_argv(options)
        launcher_env = {**os.environ, **exports}
        argv = [sys.executable, "-m", "trainrun", *options, "--",
                self.executable or sys.executable, "-m", "trainrun.rayexec.worker"]
        launch = _Launch()
        collector = Collector(secrets.token_hex(8))

        def supervise():
            try:
                code = _supervise(argv, launcher_env, collector, sys.stdout, sys.stderr, launch.tail)
            except BaseException as err:  # noqa: BLE001 (the launcher could not run: say so to the waiters)
                launch.tail.append(f"trainrun: error: the launcher did not run: {err}")
                code = 1
            launch.proc_code.append(code)
            box = self.box
            if box is not None and ray.is_initialized():  # a remote call would start a new Ray when not
                try:
                    box.fail.remote(launch_end(code, launch.tail))
                except Exception:  # noqa: BLE001 (the mailbox went with the caller's Ray: nobody waits on it)
                    pass

        # PR_SET_PDEATHSIG follows the thread that started the launcher: this one lives until the launcher ends
        launch.thread = threading.Thread(target=supervise, name="trainrun-rayexec-launch", daemon=True)
        self._launch = launch
        launch.thread.start()

    def _exports(self, address: str) -> dict[str, str]:
        """What the ranks' environment gets: the mailbox's cluster and name, and start()'s extra_env_vars."""
        return {ENV_ADDRESS: address, ENV_MAILBOX: self.name, **self._env}

    @staticmethod
    def _export_argv(exports: dict[str, str]) -> list[str]:
        """-x NAME for each of `exports` (their values are in the launcher's environment) and for Ray's token
        settings of this process (a rank joins the cluster as this caller did): by name only, so no value, a
        token or a secret in extra_env_vars, is ever on a command line."""
        argv = []
        for name in [*exports, *(n for n in RAY_AUTH if os.environ.get(n))]:
            argv += ["-x", name]
        return argv

    def shutdown(self) -> None:
        """End the ranks (they leave their loop and exit 0; a launcher still running after STOP_GRACE_S, or one
        that cannot be told because the caller already left Ray, gets SIGTERM) and remove the mailbox. Nothing of
        this executor is left afterwards."""
        import ray

        connected = self.box is not None and ray.is_initialized()  # never start a Ray here just to stop
        launch, self._launch = self._launch, None
        if launch is not None and launch.thread is not None:
            self._closing = True
            if not launch.proc_code and connected:
                try:
                    self._post(("stop",), tuple(range(self.place.size)))
                except Exception:  # noqa: BLE001 (the mailbox is gone: SIGTERM below ends the launch)
                    pass
            launch.thread.join(STOP_GRACE_S if connected else 0)
            if launch.thread.is_alive():
                self._terminate()
                launch.thread.join()
        if connected:
            ray.kill(self.box)
        self.box = None

    def _terminate(self) -> None:
        """SIGTERM to this executor's launcher (the launcher then ends its ranks)."""
        for pid in _children():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f"{ENV_MAILBOX}={self.name}".encode() in f.read().split(b"\0"):
                        os.kill(pid, signal.SIGTERM)
            except OSError:
                pass

    # -- calls

    def run(self, fn: Callable, args=None, kwargs=None, callbacks=None) -> list:
        """`fn(*args, **kwargs)` on every rank; the values in rank order."""
        if self.elastic is not None:
            return self._run_elastic(fn, tuple(args or ()), dict(kwargs or {}), callbacks)
        return self._call(("run", fn, tuple(args or ()), dict(kwargs or {})), callbacks=callbacks)

    def execute(self, fn: Callable, callbacks=None) -> list:
        """`fn(instance)` on every rank, where instance is the rank's executable_cls object (None without one)."""
        if self.elastic is not None:
            cls, a, kw = self._elastic_cls or (None, (), {})
            return self._run_elastic(_execute_fresh, (fn, cls, a, kw), {}, callbacks)
        return self._call(("execute", fn), callbacks=callbacks)

    def execute_single(self, fn: Callable):
        """`fn(instance)` on rank 0 only; its value."""
        if self.elastic is not None:
            raise NotImplementedError("Elastic mode does not support execute_single. Please use the execute method instead")
        return self._call(("execute", fn), ranks=(0,))[0]

    def run_remote(self, fn: Callable, args=None, kwargs=None) -> list:
        """As run(), but at once: one ObjectRef per rank (ray.get gives the value, or raises RankError/RunError)."""
        if self.elastic is not None:
            raise NotImplementedError("ObjectRefs cannot be returned from Elastic runs as the workers are ephemeral")
        seq = self._post(("run", fn, tuple(args or ()), dict(kwargs or {})), tuple(range(self.place.size)))
        return [self.box.outcome.remote(seq, r) for r in range(self.place.size)]

    # -- the mailbox

    def _post(self, command: tuple, ranks: tuple[int, ...]) -> int:
        import pickle

        import cloudpickle

        from trainrun.errors import UsageError

        self._check_started()
        paths = [os.path.abspath(p) for p in sys.path if isinstance(p, str) and p]
        try:
            blob = pickle.dumps((paths, cloudpickle.dumps(command)))
        except Exception as err:
            raise UsageError(f"RayExecutor: the function or its arguments cannot be pickled: {type(err).__name__}: {err}") from None
        return _ray().get(self.box.post.remote(blob, ranks))

    def _check_started(self) -> None:
        if self.box is None:
            raise RuntimeError("RayExecutor: not started (call start() first)")
        launch = self._launch
        if launch is not None and launch.proc_code and not self._closing:
            from trainrun.runfunc.errors import RunError

            raise RunError(f"RayExecutor: {launch_end(launch.proc_code[0], launch.tail)}; call shutdown() and "
                           "start() again", exit_code=launch.proc_code[0] or 1)

    def _call(self, command: tuple, ranks: tuple[int, ...] | None = None, callbacks=None) -> list:
        import cloudpickle

        from trainrun.rayexec.mailbox import ERROR
        from trainrun.runfunc.api import _named_sources
        from trainrun.runfunc.errors import RankError, RunError

        ray = _ray()
        ranks = tuple(range(self.place.size)) if ranks is None else ranks
        seq = self._post(command, ranks)
        while True:
            got, failed, done = ray.get(self.box.wait.remote(seq, 0.5))
            self._pump_logs(callbacks)
            if done:
                break
        self.box.forget.remote(seq)
        records = {r: cloudpickle.loads(b) for r, b in sorted(got.items())}
        failures = [v for k, v in records.values() if k == ERROR]
        if failures:
            fn = command[1] if len(command) > 1 else None
            failures = [replace(f, traceback=_named_sources(fn, f.traceback)) for f in failures]
            raise RankError(failures[0], failures)
        if failed or len(records) != len(ranks):
            missing = [r for r in ranks if r not in records]
            raise RunError(f"RayExecutor: rank(s) {', '.join(map(str, missing))} gave no result: {failed or 'unknown'}")
        return [records[r][1] for r in ranks]

    def _pump_logs(self, callbacks) -> None:
        """Hand what ray_logger.log sent since the last look to each callback, in order."""
        if not callbacks:
            return
        import cloudpickle

        for blob in _ray().get(self.box.logs.remote(self._log_seen)):
            self._log_seen += 1
            record = cloudpickle.loads(blob)
            for callback in callbacks:
                callback(record)

    # -- elastic

    def _run_elastic(self, fn, args: tuple, kwargs: dict, callbacks) -> list:
        from trainrun.runfunc.api import check_argv, launch_call

        self._check_started()
        ray = _ray()
        address = ray.get_runtime_context().gcs_address
        e = self.elastic
        assert e is not None
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        per = self.place.gpus if self.place.gpus else self.place.cpus
        have = ray.cluster_resources().get("GPU" if self.place.gpus else "CPU", 0)
        argv = elastic_argv(self.place, e, address, len(nodes), int(have // per) if per else e.min_np)
        argv += self.extra_argv + self._export_argv({})
        check_argv(argv)
        # the exports travel inside the call (trainrun.run puts it in the ranks' environment), not on a command line
        fn, args, kwargs = _with_env, (self._exports(address), fn, args, kwargs), {}
        result: list = []
        done = threading.Event()

        def call():
            try:
                # local=False: the call reaches the ranks in their environment (any node), as trainrun.run's with ray=
                result.append(("ok", launch_call(fn, args, kwargs, argv, local=False, executable=self.executable)))
            except BaseException as err:  # noqa: BLE001 (raised in the caller's thread below)
                result.append(("error", err))
            done.set()

        thread = threading.Thread(target=call, name="trainrun-rayexec-elastic", daemon=True)
        thread.start()
        while not done.wait(0.5):
            self._pump_logs(callbacks)
        thread.join()
        self._pump_logs(callbacks)
        kind, value = result[0]
        if kind == "error":
            raise value
        return value


def launch_end(code: int, tail: list[str]) -> str:
    """Why the ranks are gone, from the launcher's exit code and its last stderr lines: its line naming the
    first rank that ended, else its error line, else its last line. Pure."""
    said = next((ln for ln in tail if ln.startswith("trainrun: rank ")), None)
    said = said or next((ln for ln in reversed(tail) if ln.startswith("trainrun: error: ")), None)
    said = said or (tail[-1].strip() if tail else "no message")
    return f"the workers' launch ended with exit code {code}: {said.removeprefix('trainrun: ')}"


def _with_env(env: dict[str, str], fn, args: tuple, kwargs: dict):
    """An elastic call in a rank: `fn(*args, **kwargs)` with `env` in the rank's environment."""
    os.environ.update(env)
    return fn(*args, **kwargs)


def _execute_fresh(fn, cls, args, kwargs):
    """An elastic execute(): the executable_cls object made anew in every rank of every attempt."""
    return fn(cls(*args, **kwargs) if cls is not None else None)


def _children() -> list[int]:
    """This process's child processes (the launcher among them), of every thread."""
    pids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{os.getpid()}/task")
    except OSError:
        return pids
    for task in tasks:
        try:
            with open(f"/proc/{os.getpid()}/task/{task}/children") as f:
                pids += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return pids


def _mailbox_class():
    from trainrun.rayexec.mailbox import Mailbox

    return Mailbox
