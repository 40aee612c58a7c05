"""Helpers of the process tests (tests/process/test_launch_*.py): worker scripts, process checks, error
checks. The fixtures that run the launcher (run_trainrun, start_trainrun) are in tests/conftest.py."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import Run

WORKERS = Path(__file__).parent / "workers"


def worker(name: str) -> str:
    """Path of a worker script in tests/process/workers/."""
    return str(WORKERS / name)


def base_env(**changes) -> dict[str, str]:
    """The test's environment with `changes` applied (a value of None removes the variable)."""
    env = dict(os.environ)
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env

def alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")

def wait_gone(pids, timeout: float = 5.0) -> list[int]:
    """Wait until none of `pids` is alive; return those still alive after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)

def assert_all_gone(pids, timeout: float = 5.0, what: str = "processes of the job") -> None:
    """Assert every pid ends within `timeout`; survivors are SIGKILLed first so a failing test leaves
    nothing running on the box."""
    left = wait_gone(pids, timeout)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, f"{what} still running {timeout}s after the launcher ended: {left}"


def wait_for_pidfiles(directory: Path, count: int, timeout: float = 15.0, proc=None, name: str = "pid") -> dict[int, dict]:
    """Wait until `count` workers wrote DIR/NAME.RANK (see workers/job.py); return {rank: record}."""
    deadline = time.monotonic() + timeout
    while True:
        files = sorted(Path(directory).glob(f"{name}.*"))
        if len(files) >= count:
            return {int(f.suffix[1:]): json.loads(f.read_text()) for f in files}
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"launcher ended (rc {proc.returncode}) before {count} ranks started: {proc.stderr.read().decode()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"only {len(files)} of {count} ranks wrote their pid file in {timeout}s")
        time.sleep(0.05)

def all_pids(records: dict[int, dict]) -> list[int]:
    """Rank pids and grandchild pids of the records written by workers/job.py."""
    pids = []
    for rec in records.values():
        pids.append(rec["pid"])
        if rec.get("grandchild"):
            pids.append(rec["grandchild"])
    return pids

def assert_one_line_error(run: Run, code: int, *needles: str) -> str:
    """A user error: the given exit code, one `trainrun: error:` line on stderr, no traceback."""
    err = run.stderr.strip()
    assert run.rc == code, f"rc {run.rc} != {code}; stderr: {err}"
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, f"expected one line, got:\n{err}"
    assert err.startswith("trainrun: error: "), err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"
    return err


def _testbed():
    """scripts/testbed.py (stdlib only, no side effects on import), loaded once under the name
    tests/cluster/conftest.py gives it: it holds the one /proc scan for a job's processes."""
    if "trainrun_testbed" not in sys.modules:
        spec = importlib.util.spec_from_file_location("trainrun_testbed", Path(__file__).parents[2] / "scripts/testbed.py")
        sys.modules["trainrun_testbed"] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["trainrun_testbed"]


def procs_with(token: str) -> list[int]:
    """Live processes anywhere on the machine whose command line contains `token` (not this one)."""
    return _testbed().procs_with(token)


def assert_none_with(token: str, timeout: float = 5.0, what: str = "processes of the job") -> None:
    """Assert no live process has `token` in its command line within `timeout`; survivors are SIGKILLed
    first so a failing test leaves nothing running on the box."""
    deadline = time.monotonic() + timeout
    while (left := procs_with(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, f"{what} still running {timeout}s after the launcher ended: {left}"
