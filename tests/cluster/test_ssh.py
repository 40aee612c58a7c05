"""ssh.py against real sshds in the simulated hosts: parallel connect, failures classified by stage."""
import subprocess

import pytest

from trainrun.errors import HostsError
from trainrun.fanout import ssh
from trainrun.fanout.ssh import SSHOptions, connect, connect_all, known_hosts_lines

NAMES = ["h1", "h2", "h3"]


def opts(cluster, **kw):
    return SSHOptions(ssh_config=str(cluster.ssh_config), connect_timeout=5, **kw)


def failures(excinfo):
    return {f.host: f for f in excinfo.value.failures}


def test_connect_all_in_parallel(cluster):
    clients = connect_all(NAMES, opts(cluster), parallelism=3)
    try:
        assert list(clients) == NAMES
        for name, c in clients.items():
            assert c.exec_command("hostname")[1].read().decode().strip() == name
    finally:
        for c in clients.values():
            c.close()


def test_stopped_sshd_fails_that_host_and_closes_the_others(cluster, monkeypatch):
    opened = []
    real_connect = ssh.connect
    monkeypatch.setattr(ssh, "connect", lambda h, o: opened.append(real_connect(h, o)) or opened[-1])
    try:
        cluster.stop_sshd(2)
        with pytest.raises(HostsError) as e:
            connect_all(NAMES, opts(cluster))
    finally:
        cluster.start_sshd(2)
    assert list(failures(e)) == ["h2"]
    assert failures(e)["h2"].stage == "tcp" and "refused" in str(e.value)
    assert len(opened) == 2 and not any(c.get_transport() and c.get_transport().active for c in opened)


def test_wrong_port_names_every_host(cluster):
    with pytest.raises(HostsError) as e:
        connect_all(NAMES, opts(cluster, port=2222))
    assert sorted(failures(e)) == NAMES
    assert {f.stage for f in e.value.failures} == {"tcp"}
    assert "-p/--ssh-port" in str(e.value) and "\n" not in str(e.value)


def test_not_an_ssh_server_is_stage_ssh(cluster):
    """Port 2222 of h1 answers, but not with SSH."""
    server = subprocess.Popen(cluster.enter(1) + ["python3", "-c", (
        "import socket; s = socket.create_server(('0.0.0.0', 2222)); print(flush=True)\n"
        "while True:\n c, _ = s.accept(); c.sendall(b'HTTP/1.0 400 Bad Request\\r\\n\\r\\n'); c.close()")],
        stdout=subprocess.PIPE)
    try:
        server.stdout.readline()
        with pytest.raises(HostsError) as e:
            connect_all(["h1"], opts(cluster, port=2222))
    finally:
        server.kill()
        server.wait()
    assert failures(e)["h1"].stage == "ssh"


def test_wrong_key_is_stage_auth(cluster, tmp_path):
    key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    with pytest.raises(HostsError) as e:
        connect_all(["h1", "h3"], opts(cluster, identity_file=str(key)))
    assert {h: f.stage for h, f in failures(e).items()} == {"h1": "auth", "h3": "auth"}
    assert "-i/--ssh-identity-file" in str(e.value) and str(key) in str(e.value)


def test_changed_host_key_is_refused_even_without_strict(cluster, tmp_path):
    other = tmp_path / "hostkey"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    fake = " ".join(other.with_suffix(".pub").read_text().split()[:2])
    lines = cluster.known_hosts.read_text().splitlines()
    lines[1] = lines[1].split()[0] + " " + fake  # h2's line
    kh = tmp_path / "known_hosts"
    kh.write_text("\n".join(lines) + "\n")
    for strict in (False, True):
        with pytest.raises(HostsError) as e:
            connect_all(NAMES, opts(cluster, known_hosts=str(kh), strict=strict))
        assert list(failures(e)) == ["h2"]
        f = failures(e)["h2"]
        assert f.stage == "hostkey" and f"line 2 of {kh}" in str(f)
    assert kh.read_text() == "\n".join(lines) + "\n"  # nothing appended


def test_unknown_host_is_trusted_on_first_use_unless_strict(cluster, tmp_path):
    kh = tmp_path / "new" / "known_hosts"
    with pytest.raises(HostsError) as e:
        connect_all(["h1"], opts(cluster, known_hosts=str(kh), strict=True))
    assert failures(e)["h1"].stage == "hostkey" and not kh.exists()

    connect("h3", opts(cluster, known_hosts=str(kh))).close()
    ip = cluster.host(3).mgmt_ip
    assert known_hosts_lines(str(kh), ip) == [1]
    real_key = cluster.known_hosts.read_text().splitlines()[2].split()[1:3]
    assert kh.read_text().split() == [ip, *real_key]
    connect("h3", opts(cluster, known_hosts=str(kh), strict=True)).close()  # now known
