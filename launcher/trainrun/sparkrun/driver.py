"""A trainrun job on a Spark cluster's executors, from the Spark driver: `trainrun.run(func, spark=...)`, and
`horovod.spark.run` / `run_elastic` over it (_horovod/horovod/spark).

    1. one listening TCP socket on spark.driver.host (the address executors reach), port chosen by the kernel,
       and a fresh 32-byte secret (secrets.token_bytes; in the stage's closure, never logged)
    2. a barrier stage of `num_proc` tasks (one per executor slot, placed by Spark) submitted in a background
       thread under its own job group (task.py: one task per host connects back and proves the secret)
    3. the listener closes once every host's task is in, or after `start_timeout` (one line: how many tasks of
       how many arrived); a connection that fails the handshake is dropped with one line naming its address
    4. the launcher (runfunc/api.launch_call: the same child process as every trainrun.run) with `-H` the hosts
       as the tasks named them, `-np num_proc`, the NIC they all reached the driver by, and the task sockets
       inherited (wire/spark_link.ENV_LINKS; fanout/spark_engine.py): the agents run under the tasks
    5. the values in rank order, or the first cause raised here (RankError: rank, host, traceback); on any
       failure the job group is cancelled, so Spark kills the stage's tasks (and, through PR_SET_PDEATHSIG,
       their agents; the agents end their ranks). A task Spark kills ends its agent, the launcher sees the host
       lost and the job fails naming it.
"""
from __future__ import annotations

import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial

from trainrun.errors import UsageError
from trainrun.plan.hosts import is_local_name
from trainrun.wire.spark_link import ENV_LINKS, AuthError, Hello, driver_handshake, format_links



class SparkStartError(RuntimeError):
    """The stage's tasks did not all connect, or the stage failed under a job that did not see it (runfunc
    raises it as a RunError)."""


DEFAULT_START_TIMEOUT_S = 600.0  # Horovod's, also when HOROVOD_SPARK_START_TIMEOUT (seconds) does not say
HANDSHAKE_TIMEOUT_S = 10.0
STAGE_END_WAIT_S = 30.0
STAGE_FAIL_GRACE_S = 10.0


def spark_context(spark):
    """A SparkContext from a SparkSession, a SparkContext, or a master URL string ("local[4]", "spark://h:7077":
    a session is got or created with this Python as the workers' Python)."""
    if isinstance(spark, str):
        from pyspark.sql import SparkSession

        # the workers' Python: this one unless PYSPARK_PYTHON says (a local master reads only the variable)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = SparkSession.builder.master(spark).appName("trainrun")
        return builder.config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"]).getOrCreate().sparkContext
    sc = getattr(spark, "sparkContext", spark)
    if not hasattr(sc, "defaultParallelism"):
        raise UsageError(f"spark=: want a SparkSession, a SparkContext or a master URL, got {type(spark).__name__}")
    return sc


class _Stage(threading.Thread):
    """The barrier stage, submitted from this (the driver's) process in a thread of its own job group.

    When the stage fails while the launcher still runs (`launcher`, set once it started), the launcher is
    given STAGE_FAIL_GRACE_S to see it itself (a task's end ends its agent: the host is lost, and named),
    then SIGTERM (it ends the ranks); `stopped_launcher` then says why, for the error raised."""

    def __init__(self, sc, num_proc: int, group: str, task: Callable):
        super().__init__(name="trainrun-spark-stage", daemon=True)
        self.sc, self.num_proc, self.group, self.task = sc, num_proc, group, task
        self.error: BaseException | None = None
        self.launcher = None  # the launcher's Popen, once it runs
        self.stopped_launcher: str | None = None

    def run(self) -> None:
        try:
            self.sc.setJobGroup(self.group, "trainrun job", interruptOnCancel=True)
            rdd = self.sc.parallelize(range(self.num_proc), self.num_proc)
            rdd.barrier().mapPartitions(self.task).collect()
        except BaseException as err:  # reported by the waiting side
            self.error = err
            deadline = time.monotonic() + STAGE_FAIL_GRACE_S
            while self.launcher is not None and self.launcher.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.launcher is not None and self.launcher.poll() is None:
                self.stopped_launcher = _first_line(err)
                self.launcher.terminate()

    def cancel(self) -> None:
        self.sc.cancelJobGroup(self.group)


def _first_line(err: BaseException) -> str:
    """The line that says why: a Python exception's last line in Spark's report (a task's), else Spark's own."""
    import re

    lines = str(err).strip().splitlines()
    java = next((i for i, line in enumerate(lines) if line.startswith("\tat ")), len(lines))
    python = [line for line in lines[:java] if re.match(r"[\w.]+(Error|Exception|Exit|Interrupt)\b.*: ", line)]
    aborted = [line for line in lines if "SparkException: " in line]
    if python:
        return python[-1].strip()
    if aborted:
        return aborted[0].split("SparkException: ", 1)[1].strip()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def accept_hosts(listener: socket.socket, secret: bytes, num_proc: int, timeout: float,
                 stage: _Stage) -> dict[str, tuple[socket.socket, Hello]]:
    """Every host's task connection, authenticated: {host name: (socket, Hello)}. SparkStartError when the stage fails
    first or `timeout` passes (how many tasks of how many arrived)."""
    deadline = time.monotonic() + timeout
    got: dict[str, tuple[socket.socket, Hello]] = {}
    expected: int | None = None
    listener.settimeout(0.5)
    try:
        while expected is None or len(got) < expected:
            if stage.error is not None:
                raise SparkStartError(f"spark: the stage failed before its tasks connected: {_first_line(stage.error)}")
            if time.monotonic() > deadline:
                tasks = sum(h.slots for _, h in got.values())
                raise SparkStartError(f"spark: {tasks} of {num_proc} tasks arrived in {timeout:g} s (start_timeout): "
                               "Spark did not give the stage that many executor slots at once")
            try:
                conn, peer = listener.accept()
            except socket.timeout:
                continue
            conn.settimeout(HANDSHAKE_TIMEOUT_S)
            try:
                hello = driver_handshake(conn, secret, secrets.token_bytes(32))
            except (AuthError, OSError) as err:
                print(f"trainrun: spark: dropped a connection from {peer[0]}: {err}", file=sys.stderr)
                conn.close()
                continue
            conn.settimeout(None)
            name = hello.host
            if is_local_name(name):  # this machine: its ranks run under their task too, not under the launcher
                name = f"{name}-spark"
            if name in got:  # two hosts of one name (containers): tell them apart by address
                name = f"{hello.host}-{peer[0]}"
            got[name] = (conn, hello._replace(host=name))
            expected = hello.hosts
    except BaseException:
        for conn, _ in got.values():
            conn.close()
        raise
    return got


def _env_timeout() -> float:
    """HOROVOD_SPARK_START_TIMEOUT's seconds, else DEFAULT_START_TIMEOUT_S; UsageError for another value."""
    text = os.environ.get("HOROVOD_SPARK_START_TIMEOUT")
    if not text:
        return DEFAULT_START_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise UsageError(f"HOROVOD_SPARK_START_TIMEOUT={text!r}: want seconds > 0 (or unset it)")
    return value


def run_on_spark(func, args, kwargs, spark, *, launch_call: Callable[..., list], check_argv: Callable[[list[str]], None],
                 num_proc: int | None = None, start_timeout: float | None = None, option_argv: Sequence[str] = (),
                 nics: str | None = None, executable: str | None = None, out=None, err=None) -> list:
    """Run `func(*args, **kwargs)` on `num_proc` Spark barrier tasks (default: the context's
    defaultParallelism) and return the ranks' values in rank order. `option_argv`: more trainrun options
    (checked; not -H/-np, which come from the stage); `nics`: --network-interface (default: the NIC every task
    reached the driver by, when they all name the same). `launch_call`, `check_argv`: runfunc/api.py's (handed
    in: runfunc calls this module)."""
    from trainrun.sparkrun.task import barrier_task

    sc = spark_context(spark)
    num_proc = int(num_proc or sc.defaultParallelism)
    if num_proc < 1:
        raise UsageError(f"spark: num_proc must be >= 1, got {num_proc}")
    check_argv([*option_argv, "-np", str(num_proc)])
    timeout = start_timeout or _env_timeout()
    address = sc.getConf().get("spark.driver.host") or socket.gethostname()
    secret = secrets.token_bytes(32)
    listener = socket.create_server((address, 0))
    port = listener.getsockname()[1]
    stage = _Stage(sc, num_proc, f"trainrun-{secrets.token_hex(6)}", partial(barrier_task, address, port, secret))
    stage.start()
    ok = False
    try:
        try:
            hosts = accept_hosts(listener, secret, num_proc, timeout, stage)
        finally:
            listener.close()
        hello_nics = {h.nic for _, h in hosts.values()}
        nic = nics or (hello_nics.pop() if len(hello_nics) == 1 and None not in hello_nics else None)
        argv = [*option_argv, "-np", str(num_proc), "-H", ",".join(f"{n}:{h.slots}" for n, (_, h) in hosts.items())]
        if nic:
            argv += ["--network-interface", nic]
        try:
            check_argv(argv)
        except BaseException:
            for conn, _ in hosts.values():
                conn.close()
            raise
        fds = {name: conn.detach() for name, (conn, _) in hosts.items()}
        try:
            values = launch_call(func, args, kwargs, argv, local=False, executable=executable, out=out, err=err,
                                 env={ENV_LINKS: format_links(fds)}, pass_fds=tuple(fds.values()),
                                 on_start=lambda proc: setattr(stage, "launcher", proc))
        except Exception:
            if stage.stopped_launcher is not None:
                raise SparkStartError(f"spark: the stage failed while the job ran, and the job was stopped: "
                                      f"{stage.stopped_launcher}") from None
            raise
        ok = True
        return values
    finally:
        if not ok:
            stage.cancel()
        stage.join(STAGE_END_WAIT_S)
        if stage.is_alive():  # the tasks did not end by themselves: Spark ends them
            stage.cancel()
            stage.join(STAGE_END_WAIT_S)
