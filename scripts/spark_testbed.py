#!/usr/bin/env python3
"""A real Spark standalone cluster on the simulated hosts of scripts/testbed.py: the master in h1, one worker in
every other host (each inside its host's network, UTS, IPC and mount namespaces: its own /dev/shm), small
memory. The driver runs in the root namespace (10.241.0.1, which every host reaches) with
`SparkSession.builder.master(MASTER_URL)` and `driver_conf()`.

    python3 scripts/spark_testbed.py up       testbed up (3 hosts) unless one is up, then the master and workers
    python3 scripts/spark_testbed.py down     stop every Spark JVM and Python worker inside the hosts, then the
                                              testbed; safe any time, repeatable
    python3 scripts/spark_testbed.py status   the JVMs inside the hosts

Stdlib only. Needs what testbed.py needs plus Java 17 (`java` on PATH) and pyspark (its install folder is
SPARK_HOME: it ships the jars; the daemons run as `java -cp JARS/* org.apache.spark.deploy.{master.Master,
worker.Worker}`, no sbin scripts, so every pid is ours). State dir (env TRAINRUN_SPARK_STATE, default
/tmp/trainrun-spark): log/ and work-hN/ (the workers' folders, with the executors' logs: kept after `down` for
post-mortems; `up` starts from an empty dir), local-hN/ (the executors' scratch: removed by `down`).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

if "testbed" not in sys.modules:   # tests/cluster/conftest.py registers the testbed module it loaded
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import testbed

MASTER = 1                          # host index of the master
PORT = 7077
WORKER_CORES = 2
WORKER_MEMORY = "1g"
EXECUTOR_MEMORY = "512m"
DRIVER_HOST = "10.241.0.1"          # the root namespace's address on the testbed's network
STATE_DIR = Path(os.environ.get("TRAINRUN_SPARK_STATE", "/tmp/trainrun-spark"))
ROOT = Path(__file__).resolve().parents[1]
_STARTED: list[subprocess.Popen] = []


def spark_home() -> Path | None:
    try:
        import pyspark
    except ImportError:
        return None
    return Path(pyspark.__file__).parent


def missing_requirement() -> str | None:
    if shutil.which("java") is None:
        return "no java on PATH (bash scripts/setup.sh installs openjdk-17-jre-headless)"
    if spark_home() is None:
        return "pyspark is not installed (pip install pyspark==4.3.0)"
    return None


def master_url(tb: testbed.Testbed) -> str:
    return f"spark://{tb.host(MASTER).mgmt_ip}:{PORT}"


def python() -> str:
    """The Python of the driver and the executors: the repository's venv when there is one."""
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def driver_conf(executors: int = 2) -> dict[str, str]:
    """SparkConf entries for a driver in the root namespace: reachable at DRIVER_HOST, one executor of
    WORKER_CORES cores per worker host."""
    return {"spark.driver.host": DRIVER_HOST, "spark.driver.bindAddress": DRIVER_HOST,
            "spark.executor.cores": str(WORKER_CORES), "spark.cores.max": str(WORKER_CORES * executors),
            "spark.executor.memory": EXECUTOR_MEMORY, "spark.driver.memory": EXECUTOR_MEMORY,
            "spark.pyspark.python": python(), "spark.ui.enabled": "false",
            "spark.executorEnv.PYTHONPATH": str(ROOT / "launcher")}


def _env() -> dict[str, str]:
    home = spark_home()
    assert home is not None
    # SPARK_SCALA_VERSION: the worker's command builder asks for it before it looks in SPARK_HOME/jars (a
    # distribution's scripts set it; pyspark's folder has the jars but not those scripts' environment)
    scala = next(home.glob("jars/spark-core_*.jar")).name.split("_")[1].split("-")[0]
    return {**os.environ, "SPARK_HOME": str(home), "SPARK_SCALA_VERSION": scala, "PYSPARK_PYTHON": python(),
            "SPARK_NO_DAEMONIZE": "1",
            "SPARK_LOG_DIR": str(STATE_DIR / "log")}


def _java(cls: str, *args: str) -> list[str]:
    home = spark_home()
    assert home is not None
    return ["java", "-Xmx256m", "-cp", f"{home}/jars/*", cls, *args]


def _listening(ip: str, port: int) -> bool:
    try:
        socket.create_connection((ip, port), timeout=1).close()
        return True
    except OSError:
        return False


def up(tb: testbed.Testbed, timeout: float = 90.0) -> str:
    """The master in h1 and a worker in every other host; returns the master's URL once every worker has
    registered (its log says so)."""
    down_spark()
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    (STATE_DIR / "log").mkdir(parents=True)
    m = tb.host(MASTER)
    env = _env()
    procs = [(STATE_DIR / "log" / "master.log",
              tb.enter(MASTER) + _java("org.apache.spark.deploy.master.Master", "--host", m.mgmt_ip, "--port",
                                       str(PORT), "--webui-port", "18080"))]
    for log, argv in procs:
        with open(log, "ab") as f:
            _STARTED.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=f, env=env,
                                             start_new_session=True))
    for h in tb.hosts:
        if h.index != MASTER:
            start_worker(tb, h.index)
    if _registered(len(tb.hosts) - 1, timeout) and _listening(m.mgmt_ip, PORT):
        return master_url(tb)
    master_log = STATE_DIR / "log" / "master.log"
    tail = master_log.read_text(errors="replace").strip().splitlines()[-5:] if master_log.exists() else []
    down_spark()
    raise RuntimeError(f"spark testbed: not every worker registered in {timeout:g} s: {' | '.join(tail)}")


def _registered(workers: int, timeout: float) -> bool:
    """True once the master's log has registered `workers` workers in all (re-registrations count)."""
    deadline = time.monotonic() + timeout
    master_log = STATE_DIR / "log" / "master.log"
    while time.monotonic() < deadline:
        text = master_log.read_text(errors="replace") if master_log.exists() else ""
        if text.count("Registering worker") >= workers:
            return True
        time.sleep(0.5)
    return False


def start_worker(tb: testbed.Testbed, i: int, wait_s: float = 0.0) -> None:
    """A worker in host i (again, after a test killed it); with wait_s, until the master has registered it."""
    h = tb.host(i)
    master_log = STATE_DIR / "log" / "master.log"
    before = master_log.read_text(errors="replace").count("Registering worker") if master_log.exists() else 0
    work = STATE_DIR / f"work-{h.name}"
    work.mkdir(exist_ok=True)
    argv = tb.enter(i) + _java("org.apache.spark.deploy.worker.Worker", "--host", h.mgmt_ip, "--cores",
                               str(WORKER_CORES), "--memory", WORKER_MEMORY, "--work-dir", str(work),
                               "--webui-port", "18081", master_url(tb))
    local = STATE_DIR / f"local-{h.name}"  # its executors' scratch (a killed executor leaves its folder)
    local.mkdir(exist_ok=True)
    with open(STATE_DIR / "log" / f"worker-{h.name}.log", "ab") as f:
        _STARTED.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                                         env={**_env(), "SPARK_LOCAL_DIRS": str(local)}, start_new_session=True))
    if wait_s and not _registered(before + 1, wait_s):
        raise RuntimeError(f"spark testbed: the worker in {h.name} did not register in {wait_s:g} s")


def spark_processes() -> dict[int, str]:
    """pid -> command line of every Spark JVM and pyspark Python worker inside the testbed's hosts, and of
    any trainrun agent or rank there."""
    out = {}
    for ns in testbed.namespaces():
        for pid in map(int, testbed.sh("ip", "netns", "pids", ns, check=False).split()):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if testbed._alive(pid) and _ours(cmd):
                out[pid] = cmd.strip()
    return out


def _ours(cmd: str) -> bool:
    """A Spark JVM, a pyspark worker, or a trainrun agent or rank (`-m trainrun...`): not the hosts' own
    processes, whose command lines name the testbed's state dir (/tmp/trainrun-testbed/hN/sshd_config)."""
    words = cmd.split()
    return ("org.apache.spark" in cmd or "pyspark" in cmd
            or any(w == "trainrun" or w.startswith("trainrun.") for w in words))


def executor_pids() -> dict[int, str]:
    return {p: c for p, c in spark_processes().items() if "CoarseGrainedExecutorBackend" in c}


def worker_pid(host_name: str) -> int | None:
    for pid, cmd in spark_processes().items():
        if "deploy.worker.Worker" in cmd and f"work-{host_name} " in cmd:
            return pid
    return None


def down_spark(grace_s: float = 10.0) -> list[str]:
    """Stop every Spark JVM, pyspark worker and trainrun process inside the hosts (SIGTERM, SIGKILL after
    grace_s). Returns what is left (empty when all is gone)."""
    pids = list(spark_processes())
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while (pids := [p for p in pids if testbed._alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not pids:
            break
    for p in _STARTED:
        try:
            p.wait(1.0)   # reap the ones this process started
        except subprocess.TimeoutExpired:
            pass
    _STARTED.clear()
    for local in STATE_DIR.glob("local-*"):
        shutil.rmtree(local, ignore_errors=True)
    return [f"{pid} {cmd[:80]}" for pid, cmd in spark_processes().items()]


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("up", "down", "status"):
        print(__doc__)
        return 2
    if argv[0] == "status":
        for pid, cmd in spark_processes().items():
            print(pid, cmd[:160])
        return 0
    if argv[0] == "down":
        left = down_spark()
        left += testbed.down()
        print("left: " + ", ".join(left) if left else "down")
        return 1 if left else 0
    why = missing_requirement() or testbed.missing_requirement()
    if why:
        print(f"spark_testbed: {why}", file=sys.stderr)
        return 1
    tb = testbed.Testbed() if testbed.namespaces() else testbed.up(3)
    print(up(tb))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
