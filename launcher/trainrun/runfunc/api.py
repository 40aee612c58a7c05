"""`trainrun.run(func, ...)` and `horovod.run(func, ...)`: a function on N ranks, its return values back.

The job is an ordinary trainrun launch, run as a child process (`python -m trainrun ... python -m
trainrun.runfunc.task`): the same checks, environment contract, MPI world, fail-fast and teardown as
`trainrun ... train.py`, and the caller's process (a script, a Jupyter kernel) keeps its own signal
handlers. The call and the outcomes travel as wire.py says. The launcher's output is passed on to the
caller's sys.stdout/sys.stderr (so a notebook shows it), less the outcome lines; where those are a
terminal, with the ranks' terminal controls shown as text (as the launcher does on one).

If the caller dies, the launcher gets SIGTERM (PR_SET_PDEATHSIG) and tears the job down; Ctrl-C (or a
notebook's interrupt) in the caller is passed to the launcher, which ends the ranks, and then raised.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import replace

from trainrun.errors import UsageError
from trainrun.runfunc.channel import ResultServer
from trainrun.runfunc.errors import RankError, ResultTooLarge, RunError
from trainrun.wire.runfunc_lines import ENV_FILE, ENV_NONCE, ENV_REMOTE_MB, ENV_SOCKET, Collector, call_env, private_file

# trainrun options run() decides itself or that make no sense for a function call
NOT_FOR_RUN = {"prefix": "the outcome lines need the rank prefix", "fold": "the outcome lines need every rank's output",
               "show_ranks": "the outcome lines need every rank's output", "check": "use trainrun --check",
               "perf": "use trainrun --check --perf", "perf_strict": "use trainrun --check --perf",
               "perf_time": "use trainrun --check --perf", "dry_run": "use trainrun --dry-run",
               "json": "use trainrun --dry-run --json"}


def _option_argv(options: dict) -> list[str]:
    """trainrun's long options (by their Python names: ssh_port=2222, output_dir="logs") as argv, checked
    by the command's own parser and LaunchConfig (UsageError in the caller, before anything starts)."""
    import click

    from trainrun.cli.command import cli

    params = {p.name: p for p in cli.params if isinstance(p, click.Option) and p.expose_value}
    argv: list[str] = []
    for name, value in options.items():
        if name in NOT_FOR_RUN:
            raise UsageError(f"run(): {name} cannot be given ({NOT_FOR_RUN[name]})")
        p = params.get(name)
        if p is None:
            raise UsageError(f"run(): unknown option {name!r}; options are trainrun's long options by their Python "
                             "names, e.g. hosts='h1:2,h2:2', ssh_port=2222, output_dir='logs', min_np=2")
        if value is None or value is False:
            continue
        flag = max(p.opts, key=len)
        if p.is_flag or (value is True and getattr(p, "_flag_needs_value", False)):  # ray=True: --ray, no value
            argv.append(flag)
        elif p.multiple:
            for v in value:
                argv += [flag, str(v)]
        elif isinstance(value, (tuple, list)):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    check_argv(argv)
    return argv


def check_argv(argv: list[str]) -> None:
    """UsageError unless `argv` is a valid set of trainrun options (its parser and LaunchConfig's checks)."""
    import click

    from trainrun.cli.command import cli
    from trainrun.config import parse_config

    try:
        ctx = cli.make_context("trainrun", list(argv) + ["--", "python"])
    except click.ClickException as err:
        raise UsageError(f"run(): {err.format_message()}") from None
    p = dict(ctx.params)
    parse_config(p.pop("command"), json=p.pop("json_"), **p)


def run(func, args=(), kwargs=None, *, np: int | None = None, hosts: str | None = None, hostfile: str | None = None,
        executable: str | None = None, env: dict | None = None, spark=None, **options) -> list:
    """Run `func(*args, **kwargs)` on `np` ranks (on this machine, or over `hosts`/`hostfile` like
    `trainrun -np N -H ...`) and return the list of their return values, in rank order.

    Each rank runs under trainrun's environment contract (RANK, WORLD_SIZE, ... and the MPI world:
    `import trainrun.torch as hvd; hvd.init()` inside `func`). `options` are trainrun's other long
    options by their Python names (ssh_port=2222, network_interface="eth1", min_np=2, max_restarts=3,
    output_dir="logs", ...); `env` adds variables for the ranks (`-x`); `executable`: the ranks'
    Python (default: this one). func, args and kwargs are cloudpickled (functions of `__main__` by
    value); results must pickle too.

    Raises RankError when a rank's function raised (rank, host, its traceback), RunError when the job
    ended otherwise without every result, ResultTooLarge (a RunError) when a rank on another host returned
    more than wire.max_lines_bytes() pickled (64 MiB; ranks on this machine have no limit), UsageError for
    a bad option (before anything starts).
    With elastic options the values are those of the last attempt's ranks.

    `spark`: a SparkSession (or SparkContext, or a master URL such as "local[4]"): the ranks run under a
    barrier stage of `np` tasks (default: its defaultParallelism), one per executor slot, on the hosts Spark
    picks (sparkrun/driver.py); not with hosts/hostfile."""
    if spark is not None:
        if hosts or hostfile or options.get("host_discovery_script"):
            raise UsageError("run(): spark= places the ranks itself: drop hosts/hostfile/host_discovery_script")
        if env:
            options["export"] = [f"{k}={v}" for k, v in env.items()]
        nics = options.pop("network_interface", None)
        start = options.pop("start_timeout", None)
        return run_spark(func, args, kwargs, spark, num_proc=np, start_timeout=start, option_argv=_option_argv(options),
                         nics=nics, executable=executable)
    opts = dict(options)
    if np is not None:
        opts["num_proc"] = np
    if hosts is not None:
        opts["hosts"] = hosts
    if hostfile is not None:
        opts["hostfile"] = hostfile
    if env:
        opts["export"] = [f"{k}={v}" for k, v in env.items()]
    argv = _option_argv(opts)
    local = not (hosts or hostfile or options.get("host_discovery_script") or os.environ.get("SLURM_JOB_ID"))
    return launch_call(func, args, kwargs, argv, local=local, executable=executable)


def run_spark(func, args, kwargs, spark, **how) -> list:
    """The call on a Spark cluster (sparkrun/driver.run_on_spark: `how` are its keywords), through launch_call."""
    from trainrun.sparkrun.driver import SparkStartError, run_on_spark

    try:
        return run_on_spark(func, args, kwargs, spark, launch_call=launch_call, check_argv=check_argv, **how)
    except SparkStartError as err:
        raise RunError(str(err)) from None


def _call_blob(func, args, kwargs) -> bytes:
    """The call, cloudpickled, with the caller's import path: a function of an importable module travels
    by name, and the rank must find that module where the caller did (its script's folder, a test's)."""
    import pickle

    import cloudpickle

    paths = [os.path.abspath(p) for p in sys.path if isinstance(p, str) and p]
    try:  # two layers: the rank sets its path before it unpickles the call
        return pickle.dumps((paths, cloudpickle.dumps((func, tuple(args), dict(kwargs or {})))))
    except Exception as err:
        raise UsageError(f"run(): the function or its arguments cannot be pickled: {type(err).__name__}: {err}") from None


def launch_call(func, args, kwargs, option_argv: list[str], *, local: bool, executable: str | None = None,
                out=None, err=None, env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = (),
                on_start=None) -> list:
    """Start the launcher for `option_argv` (trainrun options, checked) with the call, pass its output on,
    return the values (see run()). `env`: more variables for the launcher; `pass_fds`: descriptors it inherits,
    closed here once it has started (sparkrun's task sockets: the launcher alone holds them then); `on_start`:
    called with the launcher's Popen once it runs (sparkrun stops it when its Spark stage fails)."""
    owned = list(pass_fds)  # emptied by _supervise once the launcher holds them
    try:
        return _launch_call(func, args, kwargs, option_argv, local, executable, out, err, env, owned, on_start)
    finally:
        for fd in owned:
            os.close(fd)


def _launch_call(func, args, kwargs, option_argv, local, executable, out, err, env, pass_fds, on_start) -> list:
    out = out or sys.stdout
    err = err or sys.stderr
    blob = _call_blob(func, args, kwargs)
    nonce = secrets.token_hex(8)
    child_env = {**os.environ, **(env or {}), ENV_NONCE: nonce}
    with tempfile.TemporaryDirectory(prefix="trainrun-run-") as folder:
        carry = call_env(blob)
        if carry is None and not local:
            raise UsageError(f"run(): the function and its arguments pickle to {len(blob) >> 10} KiB; at most "
                             f"{(3 << 20) // 4 >> 10} KiB reach remote hosts (in the ranks' environment): load "
                             "big data inside the function instead (from a path every host sees)")
        child_env.update(carry if carry is not None else {ENV_FILE: private_file(folder, blob)})
        argv = [sys.executable, "-m", "trainrun", *option_argv, "--prefix", "rank", "--",
                executable or sys.executable, "-m", "trainrun.runfunc.task"]
        collector = Collector(nonce)
        tail: list[str] = []
        with ResultServer(folder, nonce) as server:  # the values of ranks on this machine (channel.py)
            child_env[ENV_SOCKET] = server.path
            code = _supervise(argv, child_env, collector, out, err, tail, pass_fds, on_start)
    return _values(collector, code, tail, func, server.results)


def _die_with_parent():
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _supervise(argv, env, collector: Collector, out, err, tail: list[str], owned_fds: list[int] | None = None,
               on_start=None) -> int:
    """Run the launcher to its end; its stdout through `collector` to `out`, its stderr to `err` (the
    last lines kept in `tail`). Ctrl-C: passed on to the launcher, waited for, raised."""
    from trainrun.supervisor.output import terminal_safe

    pass_fds = tuple(owned_fds or ())
    try:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=_die_with_parent, pass_fds=pass_fds)
    finally:
        for fd in pass_fds:
            os.close(fd)  # the launcher's now: its end is the tasks' EOF
        if owned_fds:
            owned_fds.clear()
    if on_start is not None:
        on_start(proc)
    # the launcher writes to pipes (so it passes the bytes as they are): the terminal check is ours to make
    shown_out, shown_err = ((terminal_safe if _is_terminal(f) else bytes) for f in (out, err))

    def pump_out():
        for line in proc.stdout:
            shown = collector.feed(line)
            if shown is not None:
                out.write(shown_out(shown).decode(errors="replace"))
                out.flush()

    def pump_err():
        for line in proc.stderr:
            text = shown_err(line).decode(errors="replace")
            tail.append(text.rstrip("\n"))
            del tail[:-20]
            err.write(text)
            err.flush()

    threads = [threading.Thread(target=pump_out, daemon=True), threading.Thread(target=pump_err, daemon=True)]
    for t in threads:
        t.start()
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    finally:
        for t in threads:
            t.join(timeout=10)
    return code


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # a notebook's stream may lack it, or be closed
        return False


def _named_sources(func, text: str) -> str:
    """The rank's traceback with the frames of functions sent by value (cloudpickle names their file
    `<dynamic-code>`) given back their file and source line, from the caller's own: `func` and the
    functions of `__main__` (a script, a notebook's cells), matched by name."""
    import linecache
    import re
    import types

    codes: dict[str, str] = {}
    for obj in [func, *vars(sys.modules.get("__main__", types.ModuleType("m"))).values()]:
        code = getattr(obj, "__code__", None)
        if isinstance(code, types.CodeType):
            codes.setdefault(code.co_name, code.co_filename)
    out = []
    for line in text.splitlines(keepends=True):
        m = re.match(r'(\s*)File "<dynamic-code>", line (\d+), in (\S+)', line)
        if m and m.group(3) in codes:
            path, lineno = codes[m.group(3)], int(m.group(2))
            line = f'{m.group(1)}File "{path}", line {lineno}, in {m.group(3)}\n'
            source = linecache.getline(path, lineno).strip()
            if source:
                line += f"{m.group(1)}  {source}\n"
        out.append(line)
    return "".join(out)


def _values(collector: Collector, code: int, tail: list[str], func=None, streamed: dict | None = None) -> list:
    """The values of the last attempt's ranks in rank order, or the error that says why there are none.
    `streamed`: the outcomes that came through the socket (ResultServer.results); lines win over them."""
    import cloudpickle

    records = dict(streamed or {})
    records.update((k, cloudpickle.loads(v)) for k, v in collector.outcomes().items())
    last = max((a for a, _ in records), default=0)
    failures = [records[k][1] for k in collector.order if k[0] == last and records[k][0] == "error"]
    if failures:
        failures = [replace(f, traceback=_named_sources(func, f.traceback)) for f in failures]
        raise RankError(failures[0], failures)
    for (attempt, rank), record in sorted(records.items()):
        if attempt != last:
            continue
        if isinstance(record, BaseException):  # a streamed value this process could not unpickle
            raise record
        if record[0] == "too big":
            raise ResultTooLarge(rank, record[3], record[1], record[2], ENV_REMOTE_MB)
    said = next((line for line in reversed(tail) if line.startswith("trainrun: error: ")), None)
    if code == UsageError.exit_code and said:
        raise UsageError(said.removeprefix("trainrun: error: "))
    ranks = sorted(r for a, r in records if a == last)
    size = max((records[(last, r)][2] for r in ranks), default=None)
    if code != 0 or size is None or ranks != list(range(size)):
        got = f"{len(ranks)} of {size} rank(s) returned" if size else "no rank returned"
        first = next((line for line in tail if "(the first failure)" in line), None)  # the launcher's first cause
        why = (said.removeprefix("trainrun: error: ") if said else first.removeprefix("trainrun: ") if first
               else " / ".join(tail[-3:]) or "no message")
        raise RunError(f"the job ended with exit code {code} before every rank returned ({got}): {why}",
                       exit_code=code or 1)
    return [records[(last, r)][1] for r in ranks]
