"""The cross-host NIC probe over SSH: eth0 and eth1 connect all hosts; docker0 (same IP everywhere) and
eth2 (only on h2, attached to nothing) do not."""
import subprocess
import sys
import time

import pytest

from trainrun.errors import HostsError
from trainrun.nics import probe_hosts
from trainrun.ssh import SSHOptions, connect_all


@pytest.fixture(scope="module")
def clients(cluster):
    clients = connect_all([h.name for h in cluster.hosts], SSHOptions(ssh_config=str(cluster.ssh_config)))
    yield clients
    for c in clients.values():
        c.close()


def test_probe_finds_eth0_and_eth1(clients, cluster):
    result = probe_hosts(clients, sys.executable)
    assert [r.name for r in result.routable()] == ["eth0", "eth1"]
    assert [r.name for r in result.routable(include_excluded=True)] == ["eth0", "eth1"]
    assert {n.name for n in result.reports["h2"]} >= {"eth0", "eth1", "eth2", "docker0"}
    assert result.reach[("h1", "h2", "eth1", cluster.host(2).data_ip)] == "ok"
    assert result.reach[("h1", "h2", "eth2", "10.243.0.3")] != "ok"
    assert result.reach[("h3", "h1", "docker0", "172.17.0.1")] != "ok"
    deadline = time.monotonic() + 5
    while subprocess.run(["pgrep", "-f", "trainrun.nics serve h"], capture_output=True).stdout:
        assert time.monotonic() < deadline, "probe servers must end with their channel"
        time.sleep(0.05)


def test_probe_names_hosts_without_trainrun(clients):
    with pytest.raises(HostsError) as e:
        probe_hosts(clients, "/usr/bin/python3")
    assert [f.host for f in e.value.failures] == ["h1", "h2", "h3"]
    assert all(f.stage == "probe" and "trainrun" in str(f) for f in e.value.failures)
