"""horovod.ray's RayExecutor with unchanged Horovod-shaped drivers (tests/ray/programs/), each run as a user
would (`python program.py`, trainrun's `horovod` shim on PYTHONPATH) against a local `ray.init()` cluster: the
API's semantics (per-rank values in rank order, the executable_cls object and MPI world kept between calls,
execute_single, run_remote's ObjectRefs, ray_logger callbacks, a rank's exception naming it, nothing left), a
TF2 Keras MNIST-shaped fit, and an elastic torch loop that loses a worker and goes on from its last commit.

Each program gets its own Ray temporary folder, so "nothing left" is checked on its processes only (other
sessions may run Ray here too): no process of that Ray cluster, no rank of the executor."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from trainrun.plan.horovod_shim import SHIM_DIR

pytest.importorskip("ray", reason="horovod.ray needs Ray (the test extra installs it)")

PROGRAMS = Path(__file__).parent / "programs"


def _processes_mentioning(marker: bytes) -> list[str]:
    """Processes whose command line or environment holds `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if marker in cmd or marker in env:
            shown = cmd.replace(b"\0", b" ")[:160].decode(errors="replace")
            found.append(f"{pid} {shown}")
    return found


def _driver_env(tmp: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SHIM_DIR, "RAY_TMPDIR": tmp, "RAY_USAGE_STATS_ENABLED": "0"}


def _assert_nothing_left(tmp: str, timeout: float = 30) -> None:
    """No process of the driver's Ray cluster (its folder `tmp`) and no executor rank (the mailbox variable)."""
    deadline = time.monotonic() + timeout
    while True:
        left = _processes_mentioning(tmp.encode()) + _processes_mentioning(b"TRAINRUN_RAYEXEC_MAILBOX=")
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left, f"left running after the driver ended: {left}"


def run_program(name: str, *args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, dict]:
    """Run a driver program with its own Ray folder; its STEP/RESULTS lines, and nothing of it left after."""
    tmp = tempfile.mkdtemp(prefix="rx")  # short: Ray's socket paths live under it
    try:
        proc = subprocess.run([sys.executable, str(PROGRAMS / name), *args], env=_driver_env(tmp), cwd=PROGRAMS,
                              capture_output=True, text=True, timeout=timeout)
        _assert_nothing_left(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    steps: dict = {}
    for line in proc.stdout.splitlines():
        if line.startswith("STEP "):
            key, value = json.loads(line[5:])
            steps[key] = value
        elif line.startswith("RESULTS "):
            steps["results"] = json.loads(line[8:])
    return proc, steps


def test_executor_calls_keep_workers_and_return_rank_ordered_values():
    proc, s = run_program("executor_calls.py", "--num-workers", "2")
    assert proc.returncode == 0 and s.get("done"), proc.stderr[-4000:]
    run, remote = s["run"], s["remote"]
    # run(): every rank's value in rank order, one MPI world of 2 formed by hvd.init() inside fn
    assert [r[:4] for r in run] == [[0, 2, 0, 201.0], [1, 2, 1, 201.0]]
    assert s["logged"] == [{"rank": 0, "sum": 201.0}, {"rank": 1, "sum": 201.0}]  # ray_logger -> callbacks
    assert s["again"] == [2.0, 2.0]  # a later call: the same processes, the same world
    assert s["env"] == ["on", "on"]  # start()'s extra_env_vars
    # execute(): the executable_cls object of each worker, kept between calls, in the same process as run()'s
    assert s["execute"] == [[10, run[0][5]], [10, run[1][5]]]
    assert s["execute2"] == [20, 20]
    assert s["single"] == 30  # execute_single: rank 0's object only
    assert s["remote_types"] == ["ObjectRef", "ObjectRef"]
    assert [r[:4] for r in remote] == [[0, 2, 0, 3.0], [1, 2, 1, 3.0]] and [r[5] for r in remote] == [r[5] for r in run]
    # a rank's exception is raised in the caller naming the rank, with the original exception
    kind, rank, original, line = s["error"]
    assert (kind, rank, original) == ("RankError", 1, "ValueError"), s["error"]
    assert line.startswith("rank 1 on ") and "bad shard on this worker" in line
    # fail fast: the workers are gone after it, and a later call says so instead of hanging
    assert s["after_error"][0] == "RunError" and "rank 1" in s["after_error"][1], s["after_error"]
    # a worker that dies fails the call at once (the launcher's end), naming it, after a restart of the executor
    assert s["died"][0] == "RunError" and "rank 1 on " in s["died"][1] and "code 9" in s["died"][1], s["died"]
    assert s["died_s"] < 30, s["died_s"]
    # an executable_cls that raises in a worker: start() raises it, naming the rank; shutdown() still cleans up
    assert s["broken"][:2] == ["RankError", 0] and "no device here" in s["broken"][2], s["broken"]
    assert s["actors_left"] == []  # shutdown() removed the mailbox


def test_tensorflow2_keras_mnist_fit_through_the_executor():
    pytest.importorskip("tensorflow")
    proc, s = run_program("tensorflow2_mnist_ray.py", "--num-workers", "2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = s["results"]
    assert [r["rank"] for r in results] == [0, 1] and {r["size"] for r in results} == {2}
    # one model: broadcast at the start, averaged gradients after (each rank trained on its own shard)
    assert results[0]["checksum"] == pytest.approx(results[1]["checksum"], rel=1e-6)
    assert results[0]["loss"] == results[1]["loss"] and len(results[0]["loss"]) == 2  # MetricAverageCallback


def test_elastic_torch_loop_goes_on_after_losing_a_worker():
    pytest.importorskip("torch")
    proc, s = run_program("pytorch_ray_elastic.py", "--fail-once", "--min-workers", "2", "--max-workers", "2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = s["results"]
    # the values of the last attempt's ranks, in rank order, after rank 1 of attempt 0 died
    assert [(r["rank"], r["size"], r["attempt"]) for r in results] == [(0, 2, 1), (1, 2, 1)], results
    assert "rank 1" in proc.stderr and "restart 1" in proc.stderr
    # resumed from the last commit (not from scratch, not skipping): all epochs done, one model
    assert all(r["epoch"] == 2 and 12 <= r["steps"] <= 13 for r in results), results
    assert results[0]["checksum"] == pytest.approx(results[1]["checksum"], rel=1e-9)
    # ray_logger.log from rank 0 reached run()'s callbacks: one record per finished epoch of the last attempt
    assert [(r["epoch"], r["size"]) for r in s["logged"]][-2:] == [(1, 2), (2, 2)], s["logged"]


def test_a_killed_driver_leaves_nothing():
    """SIGKILL the driver while its workers wait in run(): the launcher gets SIGTERM (PR_SET_PDEATHSIG) and ends the
    ranks; the driver's local cluster ends with it, and the Ray processes connected to it (the launcher is a Ray
    driver, the mailbox and agents' actors) once they give up on its GCS."""
    pytest.importorskip("torch")
    tmp = tempfile.mkdtemp(prefix="rx")
    # the driver's local cluster dies with it: Ray's processes (the launcher is a Ray driver too) wait this long
    # for its GCS before they end (60 s by default)
    env = {**_driver_env(tmp), "RAY_gcs_rpc_server_reconnect_timeout_s": "5"}
    proc = subprocess.Popen([sys.executable, str(PROGRAMS / "killed_driver.py")], env=env, cwd=PROGRAMS,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 120
        while "STARTED" not in (proc.stdout.readline() if proc.stdout else ""):
            assert proc.poll() is None and time.monotonic() < deadline, "the driver did not start its executor"
        deadline = time.monotonic() + 60
        while len(_processes_mentioning(b"TRAINRUN_RAYEXEC_MAILBOX=")) < 2:  # both ranks are in the call
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.2)
        proc.kill()
        proc.wait()
        _assert_nothing_left(tmp, timeout=90)  # the launcher, a Ray driver too, may wait on the dead GCS a while
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
