"""`horovod.spark.run` and `run_elastic`: Horovod 0.28.1's signatures (horovod/spark/runner.py) over
sparkrun/driver.py (through api.run_spark). The arguments become a horovodrun command line read by horovodrun's translator, so an
option trainrun cannot honour gets the same one line as `horovodrun` gives it (printed as
`horovod.spark.run: ...`); `prefix_output_with_timestamp` and `verbose` (beyond -v) have no place in a
function call's output and say so. Then the job runs as trainrun.run(func, spark=...)."""
from __future__ import annotations

import sys

NO_PREFIX = ("prefix_output_with_timestamp has no effect: a function call's output keeps trainrun's rank "
             "prefix (its outcome lines need it)")


def _translated(who: str, hargv: list[str], prefix_output_with_timestamp: bool) -> tuple[list[str], int | None]:
    """(trainrun options less -np and --prefix, --start-timeout's seconds or None); the notes printed."""
    from trainrun.horovodrun.translate import translate

    t = translate(hargv + ["python"], {})
    notes = list(t.notes) + ([NO_PREFIX] if prefix_output_with_timestamp else [])
    for note in notes:
        print(f"{who}: {note}", file=sys.stderr)
    argv = list(t.argv[:t.argv.index("--")])
    out: list[str] = []
    start = None
    i = 0
    while i < len(argv):
        if argv[i] in ("-np", "--prefix", "--network-interface"):
            i += 2
            continue
        if argv[i] == "--start-timeout":
            start = int(argv[i + 1])
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out, start


def _hargv(use_mpi, use_gloo, extra_mpi_args, verbose, start_timeout) -> list[str]:
    hargv: list[str] = []
    if use_gloo:
        hargv.append("--gloo")
    if use_mpi:
        hargv.append("--mpi")
    if extra_mpi_args:
        hargv.append(f"--mpi-args={extra_mpi_args}")
    if verbose and verbose >= 2:
        hargv.append("--verbose")
    if start_timeout is not None:
        hargv += ["--start-timeout", str(int(start_timeout))]
    return hargv


def _spark_session():
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is None:
        raise ValueError("horovod.spark.run: no active SparkSession (create one with SparkSession.builder first)")
    return session


def _nics(nics) -> str | None:
    return None if not nics else nics if isinstance(nics, str) else ",".join(nics)


def run(fn, args=(), kwargs=None, num_proc=None, start_timeout=None, use_mpi=None, use_gloo=None, extra_mpi_args=None,
        env=None, stdout=None, stderr=None, verbose=1, nics=None, prefix_output_with_timestamp=False, executable=None):
    """Horovod's `horovod.spark.run`: `fn(*args, **kwargs)` on `num_proc` Spark barrier tasks of the active
    SparkSession (default: its defaultParallelism); the list of their values in rank order. A rank's exception
    is raised here as trainrun.RankError (rank, host, traceback)."""
    if use_gloo and use_mpi:
        raise ValueError("Argument use_gloo and use_mpi only allow one set True.")
    from trainrun.runfunc.api import run_spark

    argv, start = _translated("horovod.spark.run", _hargv(use_mpi, use_gloo, extra_mpi_args, verbose, start_timeout),
                              prefix_output_with_timestamp)
    for name, value in (env or {}).items():
        argv += ["-x", f"{name}={value}"]
    return run_spark(fn, args, kwargs, _spark_session(), num_proc=num_proc, start_timeout=start, option_argv=argv,
                     nics=_nics(nics), executable=executable, out=stdout, err=stderr)


def run_elastic(fn, args=(), kwargs=None, num_proc=None, min_num_proc=None, max_num_proc=None, start_timeout=None,
                elastic_timeout=None, reset_limit=None, env=None, stdout=None, stderr=None, verbose=1, nics=None,
                prefix_output_with_timestamp=False, min_np=None, max_np=None):
    """Horovod's `horovod.spark.run_elastic`: `run` through trainrun's elastic loop (--min-np/--max-np, and
    --max-restarts from reset_limit) over the stage's tasks: after a rank fails the next attempt runs on the
    hosts left (the failed rank's host sits out, trainrun's elastic rule). The stage's hosts never come back
    or grow: Spark ends a barrier stage when one of its tasks is lost."""
    min_np = min_num_proc if min_num_proc is not None else min_np
    max_np = max_num_proc if max_num_proc is not None else max_np
    from trainrun.runfunc.api import run_spark

    hargv = _hargv(None, None, None, verbose, start_timeout)
    for flag, value in (("--min-np", min_np), ("--max-np", max_np), ("--reset-limit", reset_limit),
                        ("--elastic-timeout", elastic_timeout)):
        if value is not None:
            hargv += [flag, str(int(value))]
    if num_proc is not None:
        hargv = ["-np", str(int(num_proc)), *hargv]
    argv, start = _translated("horovod.spark.run_elastic", hargv, prefix_output_with_timestamp)
    if "--min-np" not in argv:
        argv += ["--min-np", str(int(min_np or num_proc or 1))]
    for name, value in (env or {}).items():
        argv += ["-x", f"{name}={value}"]
    return run_spark(fn, args, kwargs, _spark_session(), num_proc=num_proc, start_timeout=start, option_argv=argv,
                     nics=_nics(nics), executable=None, out=stdout, err=stderr)
