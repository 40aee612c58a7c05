"""The cross-host NIC probe over SSH: eth0 and eth1 connect all hosts; docker0 (same IP everywhere) and
eth2 (only on h2, attached to nothing) do not."""
import json
import socket
import subprocess
import sys
import time

import pytest

from trainrun.errors import HostsError
from trainrun.fanout.ssh import SSHOptions
from trainrun.fanout.ssh_engine import SSHEngine
from trainrun.net.nics import probe_hosts, probe_served
from trainrun.plan.hosts import HostSpec


@pytest.fixture(scope="module")
def engine(cluster):
    engine = SSHEngine(SSHOptions(ssh_config=str(cluster.ssh_config)), sys.executable)
    assert engine.reach([HostSpec(h.name) for h in cluster.hosts]) == {}
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def hosts(cluster):
    return [h.name for h in cluster.hosts]


def test_probe_finds_eth0_and_eth1(engine, hosts, cluster):
    result = probe_hosts(engine, hosts, sys.executable)
    assert [r.name for r in result.routable()] == ["eth0", "eth1"]
    assert [r.name for r in result.routable(include_excluded=True)] == ["eth0", "eth1"]
    assert {n.name for n in result.reports["h2"]} >= {"eth0", "eth1", "eth2", "docker0"}
    assert result.reach[("h1", "h2", "eth1", cluster.host(2).data_ip)] == "ok"
    assert result.reach[("h1", "h2", "eth2", "10.243.0.3")] != "ok"
    assert result.reach[("h3", "h1", "docker0", "172.17.0.1")] != "ok"
    servers_end("trainrun.net.nics serve h")


def servers_end(pattern):
    deadline = time.monotonic() + 5
    while subprocess.run(["pgrep", "-f", pattern], capture_output=True).stdout:
        assert time.monotonic() < deadline, "probe servers must end with their channel"
        time.sleep(0.05)


def test_facts_server_reports_facts_then_serves_the_probe(engine, hosts, cluster):
    """`python -m trainrun.facts serve` (what --check starts): facts on the first line, then a probe server
    that probe_served uses as it is; it ends when its channel closes."""
    channels, tables = {}, {}
    try:
        for h in hosts:
            channels[h] = engine.run_module(h, "trainrun.facts", "serve", h, f"nonce-{h}")
        for h, ch in channels.items():
            tables[h] = json.loads(ch.readline())
        facts = tables["h2"].pop("facts")
        assert facts["hostname"] == "h2" and facts["vendor"] == "MPICH" and facts["nics"] == tables["h2"]["nics"]
        addr, port = next((a, p) for n, a, p in tables["h2"]["listen"] if n == "eth0")
        with socket.create_connection((addr, port), timeout=5) as s:
            assert s.makefile("rb").readline() == b"h2 nonce-h2\n"
        result = probe_served(engine, sys.executable, tables, {h: f"nonce-{h}" for h in hosts})
        assert [r.name for r in result.routable()] == ["eth0", "eth1"]
        assert result.reach[("h3", "h2", "eth1", cluster.host(2).data_ip)] == "ok"
    finally:
        for ch in channels.values():
            ch.close()
    servers_end("trainrun.facts serve h")


def test_probe_names_hosts_without_trainrun(engine, hosts):
    with pytest.raises(HostsError) as e:
        probe_hosts(engine, hosts, "/usr/bin/python3")
    assert [f.host for f in e.value.failures] == ["h1", "h2", "h3"]
    assert all(f.stage == "probe" and "trainrun" in str(f) for f in e.value.failures)


def test_a_launch_from_one_of_the_hosts_chooses_its_nics_too(cluster, tmp_path):
    """trainrun started on h1 with h1 among its hosts: h1's side of the probe runs as a child of the launcher,
    so the ranks get UCX_NET_DEVICES like a launch from outside the hosts, and MPI starts. Without it UCX
    allows every NIC, tries the docker0 decoy (one address on every host) and MPI_Init fails."""
    code = ("import os; from mpi4py import MPI; c = MPI.COMM_WORLD; "
            "print(c.size, c.allreduce(1), os.environ.get('UCX_NET_DEVICES'))")
    r = subprocess.run(cluster.enter(1) + [sys.executable, "-m", "trainrun", "--ssh-config", str(cluster.ssh_config),
                                           "-H", "h1:1,h2:1,h3:1", "--python", sys.executable, "--no-cache",
                                           sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line.split(":", 1)[1] for line in r.stdout.splitlines() if line.startswith("[")]
    assert lines == ["3 3 eth0,eth1"] * 3, r.stdout
