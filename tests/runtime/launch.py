"""The one place that starts ranks for the runtime tests: the trainrun launcher (`python -m trainrun
-np N`, the acceptance setting), or `mpiexec -n N` from the venv when TRAINRUN_TEST_LAUNCHER=mpiexec.
Output of ranks started by trainrun may carry a "[rank]" prefix per line: match lines with `in`.

`run_cases(worker, np)` runs tests/runtime/workers/<worker>.py on `np` ranks once; the worker runs its
cases (see workers/harness.py) and every rank writes {case: error-or-None} as JSON; the result maps
each case to the list of per-rank errors, so one launch serves many pytest tests.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

WORKERS = Path(__file__).parent / "workers"
MPIEXEC = Path(sys.executable).parent / "mpiexec"


LAUNCHERS = ("trainrun", "mpiexec")


def launcher() -> str:
    """The launcher the tests use: TRAINRUN_TEST_LAUNCHER, default trainrun."""
    name = os.environ.get("TRAINRUN_TEST_LAUNCHER", "trainrun")
    if name not in LAUNCHERS:
        raise ValueError(f"TRAINRUN_TEST_LAUNCHER={name!r}: use one of {LAUNCHERS}")
    return name


def launch_argv(np: int, argv: list[str], using: str | None = None, hosts: list[str] = ()) -> list[str]:
    """The command line that starts `argv` as `np` ranks of one MPI world (`using`: a launcher name,
    default launcher(); `hosts`: more trainrun options, e.g. -H and --ssh-config for remote hosts)."""
    if hosts or (using or launcher()) == "trainrun":
        return [sys.executable, "-m", "trainrun", "-np", str(np), *hosts, *argv]
    return [str(MPIEXEC), "-n", str(np), *argv]


def run_ranks(script: Path, np: int, args=(), env=None, timeout=120, using: str | None = None,
              hosts: list[str] = ()) -> subprocess.CompletedProcess:
    """Run to completion. On timeout the launcher gets SIGTERM first (it then ends its ranks and removes
    the job's /dev/shm segments), SIGKILL only if it does not exit; raises subprocess.TimeoutExpired."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    argv = launch_argv(np, [sys.executable, str(script), *args], using, hosts)
    with subprocess.Popen(argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, out, err) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def run_cases(worker: str, np: int, out_dir: Path, env=None, timeout=120, hosts: list[str] = ()) -> dict[str, list]:
    """Run a worker's cases on `np` ranks (on `hosts`: trainrun options placing them on remote hosts).
    Raises AssertionError (with output) if the run itself failed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        proc = run_ranks(WORKERS / f"{worker}.py", np, [str(out_dir)], env, timeout, hosts=hosts)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{worker} -np {np} timed out after {timeout}s:\n{e.stdout}\n{e.stderr}") from None
    results = {}
    for r in range(np):
        path = out_dir / f"rank{r}.json"
        if not path.exists():
            raise AssertionError(f"{worker} -np {np}: rank {r} wrote no results (rc={proc.returncode})\n"
                                 f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        for case, err in json.loads(path.read_text()).items():
            results.setdefault(case, []).append(err)
    if proc.returncode != 0:
        raise AssertionError(f"{worker} -np {np} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return results


def check(results: dict, case: str) -> None:
    errors = [f"rank {r}: {e}" for r, e in enumerate(results[case]) if e]
    assert not errors, "\n".join(errors)
