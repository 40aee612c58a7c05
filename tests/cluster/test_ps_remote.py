"""A TensorFlow parameter-server cluster on 3 simulated SSH hosts (--tf-cluster, real TensorFlow): 1 chief,
2 workers and 2 ps, the ps on two different hosts at addresses on the job's network; training makes progress,
the job exits 0 when the chief finishes and nothing is left on any host; a worker SIGKILLed on its host is
restarted there through its agent and the job still exits 0."""
import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from tests.ps.test_ps_local import Launch, assert_nothing_left, task_pid

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow not installed: pip install 'trainrun[tensorflow]'", allow_module_level=True)

pytestmark = pytest.mark.timeout(480)
EXAMPLE = Path(__file__).parents[2] / "examples" / "tensorflow" / "ps_strategy.py"


def launch(cluster, tmp_path, *extra):
    out = tmp_path / "chief.json"
    run = Launch("--ssh-config", cluster.ssh_config, "-H", "h1:2,h2:2,h3:1", "--tf-cluster", "ps=2",
                 sys.executable, EXAMPLE, "--out", out, *extra, cwd=tmp_path)
    return out, run


def test_ps_cluster_on_three_hosts(cluster, tmp_path):
    out, run = launch(cluster, tmp_path, "--steps", "60")
    assert run.wait() == 0, run.text
    doc = json.loads(out.read_text())
    losses = doc["losses"]
    assert sum(losses[-10:]) < sum(losses[:10]), losses
    assert {d.split("/")[3] for d in doc["devices"].values()} == {"task:0", "task:1"}
    served = {line.split("]<stdout>:")[1].split(" serving at ")[0]: line for line in run.lines if " serving at " in line}
    ip = {h.name: (h.mgmt_ip, h.data_ip) for h in cluster.hosts}
    address = {role: line.split("grpc://")[1].rsplit(":", 1)[0] for role, line in served.items()}
    # ranks 3 (h2) and 4 (h3) are the ps: each serves at its host's address, not on h1 with the chief
    assert address["ps 0"] in ip["h2"] and address["ps 1"] in ip["h3"], served
    assert "trainrun:" not in run.text, run.text
    assert_nothing_left(str(out))


def test_a_worker_killed_on_its_host_is_restarted_there(cluster, tmp_path):
    out, run = launch(cluster, tmp_path, "--steps", "4000")
    run.wait_for("variables on")
    pid = task_pid(str(out), "worker", 1)  # rank 2, on h2 (the hosts share this machine's /proc)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 240
    while sum(":worker 1 serving at " in line for line in run.lines) < 2:  # the restarted worker serves again
        assert run.proc.poll() is None and time.monotonic() < deadline, run.text
        time.sleep(0.2)
    restarted = task_pid(str(out), "worker", 1)
    with open(f"/proc/{restarted}/environ", "rb") as f:
        assert b"TRAINRUN_RESTART_COUNT=1" in f.read().split(b"\0")
    assert run.wait() == 0, run.text
    assert "trainrun: worker 1 (rank 2 on h2) was killed by SIGKILL: restarting it there" in run.text, run.text
    assert_nothing_left(str(out))


def test_check_lists_each_hosts_ps_ports_and_reaches_them(cluster, tmp_path):
    run = Launch("--ssh-config", cluster.ssh_config, "-H", "h1:2,h2:2,h3:1", "--tf-cluster", "ps=2", "--check", "--json",
                 cwd=tmp_path)
    assert run.wait() == 0, run.text
    doc = json.loads(run.text[run.text.index("{"):])
    rows = {r["host"]: r for r in doc["tf_cluster"]}
    assert rows["h1"]["tasks"] == "chief:0 worker:0" and rows["h2"]["tasks"] == "worker:1 ps:0"
    assert rows["h3"]["tasks"] == "ps:1" and rows["h3"]["ports"].isdigit()
    assert doc["ok"] and not doc["problems"]
