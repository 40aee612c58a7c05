"""--tf-cluster in the container cluster (`scripts/cluster up 3`, trainrun from the host): the image has no
TensorFlow, so the tasks are a small Python program that reads what trainrun gives it (TF_CONFIG,
TRAINRUN_ROLE/_INDEX) and behaves like a PS cluster's tasks: ps and workers serve until stopped, worker 1 dies
once, the chief finishes. The roles, the TF_CONFIG on the containers' network, the restart of the dead worker in
its container and the job's exit 0 when the chief finishes are checked; nothing is left in any container."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(600)]

N, SLOTS = 3, 2
NAME = f"pytest-ps-{os.getpid()}"
TASK = """
import json, os, socket, sys, time
cfg, role, i = json.loads(os.environ["TF_CONFIG"]), os.environ["TRAINRUN_ROLE"], int(os.environ["TRAINRUN_ROLE_INDEX"])
assert cfg["task"] == {"type": role, "index": i}
me = cfg["cluster"][role][i]
print("TASK", role, i, socket.gethostname(), me, json.dumps(cfg["cluster"]), os.environ.get("TRAINRUN_RESTART_COUNT"), flush=True)
if role == "chief":
    time.sleep(8)
    sys.exit(0)
if role == "worker" and i == 1 and "TRAINRUN_RESTART_COUNT" not in os.environ:
    time.sleep(2)
    sys.exit(3)
s = socket.socket()
s.bind(("0.0.0.0", int(me.rsplit(":", 1)[1])))  # the port trainrun planned is free there
s.listen()
time.sleep(600)
"""


@pytest.fixture(scope="module")
def cluster(engine, cc, tmp_path_factory):
    state = tmp_path_factory.mktemp("cluster") / NAME
    info = cc.up(N, name=NAME, state_dir=state, slots=SLOTS)
    yield info
    cc.down(NAME, state)


def test_ps_cluster_in_containers(cluster, trainrun_cmd, trainrun_env):
    r = subprocess.run(trainrun_cmd(cluster, "-np", "5", "--tf-cluster", "ps=2", "--grace", "1", "python3", "-c", TASK),
                       capture_output=True, text=True, timeout=300, cwd="/tmp", env=trainrun_env)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split("TASK ", 1)[1].split() for line in r.stdout.splitlines() if "TASK " in line]
    where = {(role, int(i)): host for role, i, host, *_ in rows}
    assert where[("chief", 0)] == "node1" and {where[("ps", 0)], where[("ps", 1)]} == {"node2", "node3"}, rows
    ips = {nd.name: (nd.mgmt_ip, nd.data_ip) for nd in cluster.nodes}
    assert all(addr.rsplit(":", 1)[0] in ips[host] for _, _, host, addr, *_ in rows), rows
    assert "trainrun: worker 1 (rank 2 on node2) exited with code 3: restarting it there as worker 1" in r.stderr, r.stderr
    assert [row[-1] for row in rows if row[:2] == ["worker", "1"]] == ["None", "1"], rows  # started twice
    time.sleep(1)
    for nd in cluster.nodes:
        left = subprocess.run(["ssh", "-F", cluster.ssh_config, nd.name, "pgrep -af TRAINRUN_ROLE || true"],
                              capture_output=True, text=True, timeout=60).stdout
        assert "python3" not in left, left
