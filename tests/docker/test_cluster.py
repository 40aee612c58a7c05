"""End to end: `scripts/cluster up 3` (image build cached between runs), sshd with host-key checking on,
`trainrun --check` from the host (both networks' NICs routable, text and JSON), an MPI allreduce over 6 ranks
on 3 containers (mpiexec from node1; trainrun from the host and from node1), then `down` leaves nothing
behind. One cluster for the module; the destructive kill test has its own (test_cluster_kill.py)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(600)]

N, SLOTS = 3, 2
NAME = f"pytest-{os.getpid()}"
REPO = Path(__file__).resolve().parents[2]

ALLREDUCE = """
import socket, numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD
a = np.full(1 << 18, c.rank + 1.0, dtype=np.float32)
b = np.empty_like(a)
c.Allreduce(a, b)
local = c.Split_type(MPI.COMM_TYPE_SHARED)
print("RESULT", c.rank, c.size, socket.gethostname(), float(b.min()), float(b.max()), local.size, flush=True)
"""


@pytest.fixture(scope="module")
def cluster(engine, cc, tmp_path_factory):
    state = tmp_path_factory.mktemp("cluster") / NAME
    t0 = time.monotonic()
    info = cc.up(N, name=NAME, state_dir=state, slots=SLOTS)
    print(f"\nup {N} nodes: {time.monotonic() - t0:.1f} s, timings {json.dumps(info.timings)}")
    yield info
    cc.down(NAME, state)  # no-op when test_down already ran


def ssh(info, node, *cmd, config=None, check=True):
    return subprocess.run(["ssh", "-F", config or info.ssh_config, node, *cmd], capture_output=True, text=True,
                          timeout=60, check=check)


def test_files_written(cluster):
    st = Path(cluster.state_dir)
    assert (st / "hostfile").read_text() == "".join(f"node{i} slots={SLOTS}\n" for i in range(1, N + 1))
    cfg = (st / "ssh_config").read_text()
    for nd in cluster.nodes:
        assert f"Host {nd.name}\n  HostName {nd.mgmt_ip}\n" in cfg
    assert cfg.count("StrictHostKeyChecking yes") == N
    assert "StrictHostKeyChecking no" not in cfg
    assert oct(st.stat().st_mode & 0o777) == "0o700"
    assert oct((st / "keys" / "id_ed25519").stat().st_mode & 0o777) == "0o600"


def test_every_sshd_answers_with_host_key_checking(cluster):
    for nd in cluster.nodes:
        assert ssh(cluster, nd.name, "hostname").stdout.strip() == nd.name


def test_unknown_host_key_is_refused(cluster, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(Path(cluster.ssh_config).read_text().replace(
        str(Path(cluster.state_dir) / "keys" / "known_hosts"), str(empty)))
    r = ssh(cluster, "node1", "true", config=str(cfg), check=False)
    assert r.returncode != 0 and "verification failed" in r.stderr.lower(), r.stderr


def test_paramiko_with_reject_policy(cluster):
    paramiko = pytest.importorskip("paramiko")
    kh = Path(cluster.state_dir) / "keys" / "known_hosts"
    for nd in cluster.nodes:
        c = paramiko.SSHClient()
        c.load_host_keys(str(kh))
        c.set_missing_host_key_policy(paramiko.RejectPolicy())
        c.connect(nd.mgmt_ip, username="root", key_filename=str(Path(cluster.state_dir) / "keys" / "id_ed25519"),
                  look_for_keys=False, allow_agent=False, timeout=10)
        try:
            _, out, _ = c.exec_command("hostname")
            assert out.read().decode().strip() == nd.name
        finally:
            c.close()


def test_two_nics_per_node(cluster):
    for nd in cluster.nodes:
        addrs = ssh(cluster, nd.name, "ip -o -4 addr show scope global").stdout
        assert nd.mgmt_ip in addrs and nd.data_ip in addrs, addrs
        assert len(addrs.strip().splitlines()) == 2


def _nic_names(cluster) -> dict[str, dict[str, str]]:
    """{node: {"mgmt": ifname, "data": ifname}} as each node names them: the engine picks eth0/eth1 (with
    Engine 20.10 `data` is eth0), so the tests never assume an order."""
    out = {}
    for nd in cluster.nodes:
        by_ip = {}
        for ln in ssh(cluster, nd.name, "ip -o -4 addr show scope global").stdout.splitlines():
            f = ln.split()
            by_ip[f[3].split("/")[0]] = f[1]
        out[nd.name] = {"mgmt": by_ip[nd.mgmt_ip], "data": by_ip[nd.data_ip]}
    return out


def _both_nics(cluster) -> tuple[dict, set[str]]:
    names = _nic_names(cluster)
    both = {frozenset(v.values()) for v in names.values()}
    assert len(both) == 1 and len(next(iter(both))) == 2, f"NIC names differ between nodes: {names}"
    return names, set(next(iter(both)))


def test_check_finds_both_networks(cluster, trainrun_env):
    """`trainrun --check --hostfile H --ssh-config C` exactly as a user types it (no --python: the probe falls
    back to the nodes' python3): exit 0, every host reached, both networks' NICs routable on every node."""
    names, both = _both_nics(cluster)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "trainrun", "--check", "--hostfile", cluster.hostfile,
                        "--ssh-config", cluster.ssh_config], capture_output=True, text=True, timeout=120,
                       cwd="/tmp", env=trainrun_env)
    print(f"\ntrainrun --check on {N} nodes: {time.monotonic() - t0:.1f} s")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert f"verdict: OK, {N * SLOTS} rank(s) on {N} host(s) can run" in out, out
    assert "problem:" not in out and "warning:" not in out, out
    lines = out.splitlines()
    top = next(i for i, ln in enumerate(lines) if ln.startswith("Hosts"))  # "Hosts (where they came from)"
    assert lines[top] == "Hosts (hosts from --hostfile, reached over ssh)", out
    hosts = lines[top + 2:top + 2 + N]
    assert [ln.split()[:3] for ln in hosts] == [[nd.name, "ok", nd.name] for nd in cluster.nodes], out
    start = lines.index("Network interfaces") + 2
    rows = {}
    for ln in lines[start:]:
        if not ln.startswith("  ") or ln.strip().startswith("routable between"):
            break
        host, nic, addrs, up, _speed, verdict = _cols(ln)
        rows[host, nic] = (addrs.split(","), up, verdict)
    for nd in cluster.nodes:
        for net, ip in (("mgmt", nd.mgmt_ip), ("data", nd.data_ip)):
            addrs, up, verdict = rows[nd.name, names[nd.name][net]]
            ok = [a.split("/")[0] for a in addrs] == [ip] and up == "up" and verdict == "routable"
            assert ok, (nd.name, net, out)
    routable = next(ln for ln in lines if ln.strip().startswith("routable between all hosts:"))
    assert set(routable.split(":", 1)[1].replace(",", " ").split()) == both, out


def _cols(line: str) -> list[str]:
    """A row of --check's tables: columns are separated by two or more spaces ("10000 Mb/s" is one)."""
    return re.split(r"\s{2,}", line.strip())


def test_check_json(cluster, trainrun_cmd, trainrun_env):
    """The same check, --json, strict host keys: ok, both NICs chosen, each NIC's address on its network."""
    names, both = _both_nics(cluster)
    r = subprocess.run(trainrun_cmd(cluster, "--check", "--json"), capture_output=True, text=True, timeout=120,
                       cwd="/tmp", env=trainrun_env)
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(r.stdout)
    assert d["ok"] is True and d["problems"] == [] and d["warnings"] == [], d
    assert set(d["nics"]) == both
    assert [h["host"] for h in d["hosts"]] == [nd.name for nd in cluster.nodes]
    for h, nd in zip(d["hosts"], cluster.nodes):
        assert h["ok"] and h["stage"] is None and h["facts"]["hostname"] == nd.name, h
        assert h["facts"]["vendor"] == "MPICH" and h["facts"]["python"] == "/opt/venv/bin/python3", h["facts"]
        nics = {n["name"]: [a.split("/")[0] for a in n["addresses"]] for n in h["facts"]["nics"]}
        assert nics[names[nd.name]["mgmt"]] == [nd.mgmt_ip] and nics[names[nd.name]["data"]] == [nd.data_ip], nics
    assert [(x["rank"], x["host"], x["local_rank"], x["cross_rank"]) for x in d["ranks"]] == [
        (i, f"node{i // SLOTS + 1}", i % SLOTS, i // SLOTS) for i in range(N * SLOTS)]


def test_mpi_allreduce_6_ranks_on_3_containers(cluster):
    # Hydra's mpiexec from node1 (ssh with the in-cluster config: job key, collected host keys): the
    # reference the trainrun tests below are measured against.
    r = subprocess.run(
        ["docker", "exec", cluster.nodes[0].container, "mpiexec", "-launcher", "ssh", "-f", "/keys/hosts.mpich",
         "-n", str(N * SLOTS), "python", "-c", ALLREDUCE],
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("RESULT")]
    assert sorted(int(x[1]) for x in rows) == list(range(N * SLOTS))
    expected = float(sum(range(1, N * SLOTS + 1)))
    assert all(int(x[2]) == N * SLOTS and float(x[4]) == float(x[5]) == expected for x in rows), rows
    assert all(int(x[6]) == SLOTS for x in rows), rows
    per_host = {}
    for x in rows:
        per_host[x[3]] = per_host.get(x[3], 0) + 1
    assert per_host == {nd.name: SLOTS for nd in cluster.nodes}


def _check_trainrun_output(out: str) -> None:
    rows = [ln.split("RESULT", 1)[1].split() for ln in out.splitlines() if "RESULT" in ln]
    assert sorted(int(x[0]) for x in rows) == list(range(N * SLOTS)), out
    expected = float(sum(range(1, N * SLOTS + 1)))
    assert all(int(x[1]) == N * SLOTS and float(x[3]) == float(x[4]) == expected for x in rows), out
    assert all(int(x[5]) == SLOTS for x in rows), out  # Split_type(COMM_TYPE_SHARED): the ranks of one node
    assert sorted(x[2] for x in rows) == sorted([nd for nd in (f"node{i}" for i in range(1, N + 1))] * SLOTS)


def test_trainrun_from_the_host(cluster, trainrun_cmd, trainrun_env):
    """trainrun on the host (not mpiexec), ranks in the containers, one MPI world through trainrun's PMI:
    world size 6, exact sums, 2 ranks per node in the shared-memory split."""
    t0 = time.monotonic()
    r = subprocess.run(trainrun_cmd(cluster, "-np", str(N * SLOTS), "python3", "-c", ALLREDUCE),
                       capture_output=True, text=True, timeout=180, cwd="/tmp", env=trainrun_env)
    print(f"\ntrainrun -np 6 allreduce from the host: {time.monotonic() - t0:.1f} s")
    assert r.returncode == 0, r.stdout + r.stderr
    _check_trainrun_output(r.stdout)


def test_trainrun_from_node1(cluster):
    """The other way round: trainrun inside node1, the others reached with /keys/ssh_config (= ~/.ssh/config)."""
    r = subprocess.run(["docker", "exec", cluster.nodes[0].container, "trainrun", "-np", str(N * SLOTS),
                        "--hostfile", "/keys/hostfile", "--ssh-strict", "python3", "-c", ALLREDUCE],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    _check_trainrun_output(r.stdout)


def test_entrypoint_refuses_to_start_without_a_key(cluster):
    r = subprocess.run(["docker", "run", "--rm", cluster.image], capture_output=True, text=True, timeout=60)
    assert r.returncode == 64 and "no authorized key" in r.stderr


def test_launch_from_inside_node1(cluster):
    """The other way round: `scripts/cluster compose ... exec node1` and node1 reaches the others by name with
    the job key and the collected host keys (StrictHostKeyChecking yes in /keys/ssh_config)."""
    r = subprocess.run([str(REPO / "scripts" / "cluster"), "compose", "--name", NAME, "--state-dir",
                        cluster.state_dir, "exec", "-T", "node1", "sh", "-c",
                        "cat /keys/hostfile; for h in node2 node3; do ssh $h hostname; done"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["node1", "slots=2", "node2", "slots=2", "node3", "slots=2", "node2", "node3"]


def test_image_has_no_keys_baked_in(cluster):
    r = subprocess.run(["docker", "run", "--rm", "--entrypoint", "sh", cluster.image, "-c",
                        "ls /etc/ssh/ssh_host_* /root/.ssh/* 2>/dev/null; true"],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == ""


def test_entrypoint_takes_the_key_from_env(cluster):
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEnvKeyForTheTestOnly0000000000000000000 env-test"
    r = subprocess.run(["docker", "run", "--rm", "-e", f"TRAINRUN_AUTHORIZED_KEY={key}", "--entrypoint", "sh",
                        cluster.image, "-c", "sed -i 's/^exec .*/exit 0/' /usr/local/bin/trainrun-node-entrypoint && "
                        "trainrun-node-entrypoint && cat /root/.ssh/authorized_keys && ls /etc/ssh/ssh_host_*"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == key
    assert "/etc/ssh/ssh_host_ed25519_key" in r.stdout  # made at start, not baked in


HVD_TRAIN = """
import socket, numpy as np
import trainrun.numpy as hvd
hvd.init()
total = hvd.allreduce(np.array([float(hvd.rank())]), op=hvd.Sum)
print("HVD", hvd.rank(), hvd.size(), socket.gethostname(), int(total[0]), flush=True)
"""


def test_horovodrun_tutorial_line_from_node1(cluster):
    """horovodrun's tutorial line as written, inside node1 (the nodes' sshd listens on 22: `-p 22` for the
    tutorial's 2222), train.py at the same path on every node as Horovod expects."""
    for nd in cluster.nodes:
        subprocess.run(["docker", "exec", "-i", nd.container, "sh", "-c", "cat > /tmp/hvd_train.py"], input=HVD_TRAIN,
                       text=True, check=True, timeout=60)
    r = subprocess.run(["docker", "exec", "-w", "/tmp", cluster.nodes[0].container, "horovodrun", "--verbose",
                        "--network-interface", "eth0", "--hostfile", "/keys/hostfile", "-p", "22", "-np", "4",
                        "python", "hvd_train.py"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = sorted(line.split("<stdout>:", 1) for line in r.stdout.splitlines() if "<stdout>:HVD" in line)
    assert [tag for tag, _ in rows] == [f"[1,{k}]" for k in range(4)], r.stdout
    assert [text.split()[1:] for _, text in rows] == [[str(k), "4", f"node{k // 2 + 1}", "6"] for k in range(4)]


# last in this file: it tears down the cluster every test above shares (pytest runs a file in order)
def test_down_leaves_nothing(cluster, cc):
    cc.down(NAME, cluster.state_dir)
    assert cc.leftovers(cc.project_name(NAME)) == {"containers": [], "networks": [], "volumes": []}
    assert not Path(cluster.state_dir).exists()
    assert subprocess.run(["docker", "ps", "-aq", "--filter", f"label=org.trainrun.cluster={NAME}"],
                          capture_output=True, text=True).stdout.strip() == ""
