"""horovod.spark.run on a real Spark standalone cluster (the `spark` fixture: master in h1, workers in h2 and h3),
the driver in the root namespace. A Horovod-shaped program trains a small torch model on 4 barrier tasks; a
rank's exception reaches the driver naming rank and host; a killed worker or a killed driver leaves no agent,
rank or /dev/shm file on any host. The kill tests run last (they restart what they killed)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest


from trainrun.plan.horovod_shim import SHIM_DIR  # the driver's `import horovod` is trainrun's shim

from .conftest import spark_testbed

HERE = Path(__file__).parent
ROOT = HERE.parents[2]


@pytest.fixture(autouse=True)
def local_dir(tmp_path_factory):
    """The drivers' spark.local.dir, removed after the test: a driver that is killed (or whose executors are)
    leaves its scratch folder behind."""
    global _LOCAL_DIR
    _LOCAL_DIR = str(tmp_path_factory.mktemp("spark-local"))
    yield
    shutil.rmtree(_LOCAL_DIR, ignore_errors=True)


_LOCAL_DIR = ""


def driver(url: str, mode: str) -> subprocess.Popen:
    env = {**os.environ, "PYSPARK_PYTHON": spark_testbed.python(),
           "PYTHONPATH": os.pathsep.join([SHIM_DIR, str(ROOT / "launcher")])}
    conf = {**spark_testbed.driver_conf(), "spark.local.dir": _LOCAL_DIR}
    return subprocess.Popen([spark_testbed.python(), str(HERE / "spark_driver.py"), url, json.dumps(conf), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)


def job_left(tb) -> list[str]:
    """trainrun's agents and ranks in any host, the launcher in the root namespace, /dev/shm files of
    trainrun in any host."""
    procs = [f"{pid} {cmd[:100]}" for pid, cmd in spark_testbed.spark_processes().items() if "-m trainrun" in cmd]
    procs += [f"{pid} (launcher, root ns)" for pid in spark_testbed.testbed.procs_with("trainrun.runfunc.task")
              if _spark_launcher(pid)]
    for h in tb.hosts:
        shm = tb.run(h.index, ["ls", "/dev/shm"]).stdout.split()
        procs += [f"{h.name}:/dev/shm/{f}" for f in shm if "trainrun" in f or f.startswith("mpich")]
    return procs


def _spark_launcher(pid: int) -> bool:
    try:
        return b"TRAINRUN_SPARK_LINKS=" in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def settled(tb, timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := job_left(tb)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def read_lines(proc) -> list[str]:
    """proc's stdout lines as they come (a thread appends them; another keeps its stderr's tail, so that the
    driver never blocks on a full pipe)."""
    lines: list[str] = []
    proc.err_tail = []

    def pump():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    def pump_err():
        for line in proc.stderr:
            proc.err_tail.append(line)
            del proc.err_tail[:-50]

    threading.Thread(target=pump, daemon=True).start()
    threading.Thread(target=pump_err, daemon=True).start()
    return lines


def ranks_ready(proc, lines: list[str], n: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if sum("READY" in line for line in lines) >= n:
            return True
        time.sleep(0.2)
    return False


def test_horovod_spark_run_trains_on_four_barrier_tasks(spark):
    url, tb = spark
    p = driver(url, "train")
    out, err = p.communicate(timeout=240)
    line = next((x for x in out.splitlines() if x.startswith("RESULTS ")), None)
    assert p.returncode == 0 and line, f"rc {p.returncode}\n{out[-3000:]}\n{err[-3000:]}"
    results = json.loads(line.split(" ", 1)[1].rsplit(" ", 1)[0])
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert {r["size"] for r in results} == {4}
    assert {r["host"] for r in results} == {"h2", "h3"}  # the workers' hosts, two tasks each
    assert len({round(r["sum"], 6) for r in results}) == 1  # one model: the allreduced steps agree
    assert settled(tb) == []


def test_rank_exception_is_raised_in_the_driver_with_rank_and_host(spark):
    url, tb = spark
    p = driver(url, "raise")
    out, err = p.communicate(timeout=240)
    line = next((x for x in out.splitlines() if x.startswith("RAISED ")), "")
    assert p.returncode == 3 and line.startswith("RAISED RankError"), f"{out[-3000:]}\n{err[-3000:]}"
    assert "rank 3 on h" in line and "ValueError: rank three fails on h" in line
    assert settled(tb) == []


def test_run_elastic_goes_on_without_the_failed_ranks_host(spark):
    url, tb = spark
    p = driver(url, "elastic")
    out, err = p.communicate(timeout=240)
    line = next((x for x in out.splitlines() if x.startswith("RESULTS ")), None)
    assert p.returncode == 0 and line, f"rc {p.returncode}\n{out[-3000:]}\n{err[-3000:]}"
    results = json.loads(line.split(" ", 1)[1].rsplit(" ", 1)[0])
    failed = next(x.split("FAILED_ON ", 1)[1].strip() for x in out.splitlines() if "FAILED_ON " in x)
    said = f"{results} (rank 3 failed on {failed})\n{out[-2000:]}\n{err[-2000:]}"
    assert [r["rank"] for r in results] == [0, 1] and {r["size"] for r in results} == {2}, said
    assert {r["host"] for r in results} == {"h2", "h3"} - {failed}, said  # that host sits out: the other goes on
    assert {r["attempt"] for r in results} == {"1"}, said
    assert settled(tb) == []


def test_killed_worker_fails_the_job_naming_its_host_and_leaves_nothing(spark):
    url, tb = spark
    p = driver(url, "hang")
    try:
        lines = read_lines(p)
        assert ranks_ready(p, lines, 4, 180), "\n".join(lines[-20:])
        victim = spark_testbed.worker_pid("h3")
        assert victim and tb.on_host(3, list(spark_testbed.executor_pids()))
        os.kill(victim, signal.SIGKILL)  # the worker alone: its executor, the task and the agent must follow
        p.wait(timeout=120)
        err = "".join(p.err_tail)
        assert p.returncode == 3, f"rc {p.returncode}\n{lines[-20:]}\n{err[-3000:]}"
        raised = next((x for x in lines if x.startswith("RAISED ")), "")
        assert "lost the agent on h3" in raised, raised + "\n" + err[-3000:]  # the first cause, its host named
        assert settled(tb, 60) == []
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        spark_testbed.start_worker(tb, 3, wait_s=60)


def test_killed_driver_leaves_nothing_on_any_host(spark):
    url, tb = spark
    p = driver(url, "hang")
    try:
        lines = read_lines(p)
        assert ranks_ready(p, lines, 4, 180), "\n".join(lines[-20:])
        os.kill(p.pid, signal.SIGKILL)  # the driver alone: its launcher and Spark's JVM must follow
        p.wait()
        assert settled(tb, 90) == []
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
