"""trainrun.run(func, spark=...) and horovod.spark.run on a real local Spark (`local[2]`, one JVM for the
module): the ranks run under the barrier tasks' agents (the driver's own machine is named HOST-spark, so even
here its ranks run under their task, over the authenticated socket), values come back in rank order, a rank's
exception is raised with its rank and host, a stage Spark cannot run fails in one line, and nothing is left."""
from __future__ import annotations

import os
import sys
import time

import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (the test extra has it)")


def _java() -> bool:
    import shutil

    return shutil.which("java") is not None


pytestmark = pytest.mark.skipif(not _java(), reason="no java on PATH (scripts/setup.sh installs openjdk-17)")


@pytest.fixture(scope="module")
def session():
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    s = SparkSession.builder.master("local[2]").appName("trainrun-tests").config("spark.ui.enabled", "false") \
        .getOrCreate()
    s.sparkContext.setLogLevel("ERROR")
    try:
        yield s
    finally:
        s.stop()
        _end_jvm()


def _end_jvm():
    """The JVM pyspark started for this process ends too (stop() keeps it for a next session): it leaves when
    its stdin closes."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        proc.stdin.close()
        proc.wait(30)
    SparkContext._gateway = SparkContext._jvm = None


def _agents_left() -> list[int]:
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            try:
                cmd = open(f"/proc/{name}/cmdline", "rb").read()
                env = open(f"/proc/{name}/environ", "rb").read()
            except OSError:
                continue
            if (b"trainrun.agent" in cmd or b"trainrun.runfunc.task" in cmd) and b"TRAINRUN_SPARK" in env + cmd:
                out.append(int(name))
    return out


def _parent_and_rank():
    import os

    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        parent = f.read().replace(b"\0", b" ").decode()
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), parent


def test_values_in_rank_order_from_ranks_under_the_tasks_agents(session):
    import trainrun

    got = trainrun.run(_parent_and_rank, spark=session)
    assert [g[:2] for g in got] == [(0, 2), (1, 2)]
    assert all("-m trainrun.agent" in g[2] for g in got)  # not the launcher's own children: the task's agent


def _fails_on_one():
    import os

    if os.environ["RANK"] == "1":
        raise KeyError("rank one's key")
    return 0


def test_rank_exception_names_rank_and_host(session):
    import trainrun

    with pytest.raises(trainrun.RankError) as info:
        trainrun.run(_fails_on_one, spark=session, np=2)
    assert info.value.rank == 1 and info.value.host.endswith("-spark")
    assert "KeyError" in str(info.value) and "rank one's key" in str(info.value)
    deadline = time.monotonic() + 15
    while _agents_left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _agents_left() == []


def test_tasks_that_do_not_arrive_in_start_timeout_fail_in_one_line(session):
    import trainrun

    t0 = time.monotonic()
    with pytest.raises(trainrun.RunError) as info:
        trainrun.run(_parent_and_rank, spark=session, np=3, start_timeout=8)  # 3 barrier tasks, 2 slots: Spark waits
    assert str(info.value) == ("spark: 0 of 3 tasks arrived in 8 s (start_timeout): Spark did not give the stage "
                               "that many executor slots at once")
    assert time.monotonic() - t0 < 40  # the stage cancelled, not waited for
    assert session.sparkContext.statusTracker().getActiveStageIds() == []


def _rank():
    import horovod.torch as hvd

    hvd.init()
    return hvd.rank()


def test_horovod_spark_run_with_its_signature_and_notes(session, capsys):
    from trainrun.plan.horovod_shim import SHIM_DIR

    sys.path.insert(0, SHIM_DIR)
    try:
        import horovod.spark

        assert horovod.spark.run(_rank, num_proc=2, use_gloo=True, extra_mpi_args="--mca btl tcp,self") == [0, 1]
    finally:
        sys.path.remove(SHIM_DIR)
    err = capsys.readouterr().err
    assert "horovod.spark.run: --gloo: the ranks run in trainrun's MPI world" in err
    assert "horovod.spark.run: --mpi-args: --mca btl tcp,self has no effect" in err


def test_bad_input_is_one_line_before_any_stage(session, monkeypatch):
    import trainrun
    from trainrun.errors import UsageError

    monkeypatch.setenv("HOROVOD_SPARK_START_TIMEOUT", "soon")
    with pytest.raises(UsageError, match=r"^HOROVOD_SPARK_START_TIMEOUT='soon': want seconds > 0 \(or unset it\)$"):
        trainrun.run(_rank, spark=session)
    monkeypatch.delenv("HOROVOD_SPARK_START_TIMEOUT")
    with pytest.raises(UsageError, match="spark= places the ranks itself: drop hosts"):
        trainrun.run(_rank, spark=session, hosts="h1:2")
    with pytest.raises(UsageError, match="spark=: want a SparkSession, a SparkContext or a master URL, got int"):
        trainrun.run(_rank, spark=4)
    assert session.sparkContext.statusTracker().getJobIdsForGroup(None) == []


def _wait_forever(folder):
    import os
    import time

    open(os.path.join(folder, os.environ["RANK"]), "w").close()
    time.sleep(600)


def test_a_stage_cancelled_mid_job_ends_the_job_and_leaves_nothing(session, tmp_path):
    """Spark ends the stage (here: the application cancels its jobs, as a scheduler or a user would): the
    tasks' agents go with their tasks, or the driver stops the launcher after STAGE_FAIL_GRACE_S."""
    import threading

    import trainrun

    def cancel_when_running():
        deadline = time.monotonic() + 120
        while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        session.sparkContext.cancelAllJobs()

    canceller = threading.Thread(target=cancel_when_running, daemon=True)
    canceller.start()
    t0 = time.monotonic()
    with pytest.raises(trainrun.RunError):
        trainrun.run(_wait_forever, args=(str(tmp_path),), spark=session, np=2)
    canceller.join(5)
    assert sorted(os.listdir(tmp_path)) == ["0", "1"]
    assert time.monotonic() - t0 < 90
    deadline = time.monotonic() + 15
    while _agents_left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _agents_left() == []
