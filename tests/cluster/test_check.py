"""`trainrun --check` against the simulated hosts: facts, the NIC probe's choice, and every failure
stage named with its host and a non-zero exit."""
import json
import os
import subprocess
import sys
import time

CHECK_FAILED = 4


def check(cluster, *args, cwd, config=None):
    argv = [sys.executable, "-m", "trainrun", "--ssh-config", str(config or cluster.ssh_config), "--check", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd)


def test_check_passes_and_finds_the_routable_nics(cluster, tmp_path):
    def shm():  # every host's own /dev/shm (each has its own tmpfs): --check must leave nothing there
        return {(h.index, f) for h in cluster.hosts for f in cluster.run(h.index, ["ls", "-A", "/dev/shm"]).stdout.split()}

    shm_before = shm()
    r = check(cluster, "--hostfile", str(cluster.hostfile), "--no-cache", cwd=tmp_path)
    assert shm() - shm_before == set()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "routable between all hosts: eth0, eth1" in r.stdout
    assert "verdict: OK, 6 rank(s) on 3 host(s) can run" in r.stdout
    rows = {tuple(line.split()[:2]): line for line in r.stdout.splitlines() if line.startswith("  h")}
    assert "excluded" in rows[("h1", "docker0")]
    assert "not routable" in rows[("h2", "eth2")]
    doc = json.loads(check(cluster, "--hostfile", str(cluster.hostfile), "--json", cwd=tmp_path).stdout)
    assert doc["ok"] and doc["nics"] == ["eth0", "eth1"]
    verdicts = {(row["host"], row["nic"]): row["verdict"] for row in doc["nic_table"]}
    assert verdicts[("h2", "eth1")] == "routable" and verdicts[("h2", "eth2")] == "not routable to all hosts"
    assert [h["facts"]["hostname"] for h in doc["hosts"]] == ["h1", "h2", "h3"]
    assert all(h["facts"]["vendor"] == "MPICH" and h["facts"]["cpus"] >= 1 for h in doc["hosts"])
    assert len(doc["ranks"]) == 6
    no_probe_server_left()


def no_probe_server_left():
    deadline = time.monotonic() + 5
    while subprocess.run(["pgrep", "-f", "trainrun.facts serve h"], capture_output=True).stdout:
        assert time.monotonic() < deadline, "the probe servers --check started must end with it"
        time.sleep(0.05)


def test_one_host_needs_no_probe(cluster, tmp_path):
    r = check(cluster, "-H", "h2:2", "--json", cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["ok"], r.stdout + r.stderr
    assert doc["hosts"][0]["facts"]["hostname"] == "h2" and doc["nic_table"] == [] and len(doc["ranks"]) == 2


def test_missing_trainrun_is_named_at_the_facts_stage(cluster, tmp_path):
    r = check(cluster, "--hostfile", str(cluster.hostfile), "--python", "/usr/bin/python3", cwd=tmp_path)
    assert r.returncode == CHECK_FAILED
    for h in ("h1", "h2", "h3"):
        assert any(line.startswith(f"problem: {h}: facts: ") and "No module named 'trainrun'" in line
                   and line.endswith("(install trainrun there, or pass --python)") for line in r.stdout.splitlines()), r.stdout
    assert "Network interfaces" not in r.stdout and "Traceback" not in r.stderr


def test_launch_exports_the_probed_nics(cluster, tmp_path):
    code = "import os; print(os.environ['NCCL_SOCKET_IFNAME'], os.environ['GLOO_SOCKET_IFNAME'], os.environ['UCX_NET_DEVICES'])"
    argv = [sys.executable, "-m", "trainrun", "--ssh-config", str(cluster.ssh_config), "--no-cache", "-H", "h1:1,h3:1",
            "python", "-c", code]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert {line.split(":", 1)[1] for line in r.stdout.splitlines()} == {"eth0,eth1 eth0,eth1 eth0,eth1"}
    pinned = subprocess.run([*argv[:5], "--network-interface", "eth1", *argv[5:]], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert {line.split(":", 1)[1] for line in pinned.stdout.splitlines()} == {"eth1 eth1 eth1"}


def test_pinned_nic_that_does_not_route_fails(cluster, tmp_path):
    r = check(cluster, "--hostfile", str(cluster.hostfile), "--network-interface", "eth2", cwd=tmp_path)
    assert r.returncode == CHECK_FAILED
    assert "problem: --network-interface eth2: not routable between all hosts (routable: eth0, eth1)" in r.stdout


def test_stopped_sshd_names_the_host(cluster, tmp_path):
    cluster.stop_sshd(2)
    try:
        r = check(cluster, "--hostfile", str(cluster.hostfile), cwd=tmp_path)
    finally:
        cluster.start_sshd(2)
    assert r.returncode == CHECK_FAILED
    assert "problem: h2: tcp: connection to 10.241.0.3:22 refused" in r.stdout
    assert "h1 " in r.stdout and "FAILED at tcp" in r.stdout and "Traceback" not in r.stderr
    no_probe_server_left()  # h1 and h3 served: their servers end with the check


def test_wrong_port_names_every_host(cluster, tmp_path):
    r = check(cluster, "--hostfile", str(cluster.hostfile), "-p", "2222", cwd=tmp_path)
    assert r.returncode == CHECK_FAILED
    for h, ip in (("h1", "10.241.0.2"), ("h2", "10.241.0.3"), ("h3", "10.241.0.4")):
        assert f"problem: h{h[1]}: tcp: connection to {ip}:2222 refused" in r.stdout


def test_wrong_key_is_an_auth_failure(cluster, tmp_path):
    key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    r = check(cluster, "-H", "h1:2", "-i", str(key), cwd=tmp_path)
    assert r.returncode == CHECK_FAILED
    assert "problem: h1: auth: root@10.241.0.2:22 accepted none of the keys" in r.stdout


def test_changed_host_key_is_refused(cluster, tmp_path):
    other = tmp_path / "hostkey"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    lines = cluster.known_hosts.read_text().splitlines()
    lines[2] = lines[2].split()[0] + " " + " ".join(other.with_suffix(".pub").read_text().split()[:2])  # h3
    kh = tmp_path / "known_hosts"
    kh.write_text("\n".join(lines) + "\n")
    config = tmp_path / "ssh_config"
    config.write_text(cluster.ssh_config.read_text().replace(str(cluster.known_hosts), str(kh)))
    r = check(cluster, "--hostfile", str(cluster.hostfile), cwd=tmp_path, config=config)
    assert r.returncode == CHECK_FAILED
    assert "problem: h3: hostkey: host key for 10.241.0.4 CHANGED" in r.stdout and f"line 3 of {kh}" in r.stdout


# issue 25 item 4: what the launch would stumble on is found by --check, each in one line naming the host

def launch(cluster, *args, cwd):
    argv = [sys.executable, "-m", "trainrun", "--ssh-config", str(cluster.ssh_config), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd)


def test_missing_workdir_is_named_per_host(cluster, tmp_path):
    """Before: --check passed, and the launch then ended with 127 and a line per rank."""
    r = check(cluster, "--hostfile", str(cluster.hostfile), "--workdir", "/no/such/dir", cwd=tmp_path)
    assert r.returncode == CHECK_FAILED, r.stdout + r.stderr
    for h in ("h1", "h2", "h3"):
        assert f"problem: {h}: workdir: working directory /no/such/dir does not exist there (create it, or pass --workdir)" \
            in r.stdout, r.stdout
    assert "Traceback" not in r.stderr
    no_probe_server_left()


def test_wrong_python_path_is_named(cluster, tmp_path):
    """Before: a --python missing on the hosts was silently replaced by python3."""
    r = check(cluster, "-H", "h2:1", "--python", "/opt/nowhere/bin/python3", cwd=tmp_path)
    assert r.returncode == CHECK_FAILED, r.stdout + r.stderr
    assert "problem: h2: python: --python /opt/nowhere/bin/python3: no such interpreter there" in r.stdout, r.stdout
    run = launch(cluster, "-H", "h2:1", "--python", "/opt/nowhere/bin/python3", "true", cwd=tmp_path)
    assert run.returncode == 3 and run.stderr.strip().splitlines() == [
        "trainrun: error: h2: python: --python /opt/nowhere/bin/python3: no such interpreter there "
        "(check the path given to --python)"], run.stderr


def test_no_python_on_a_host(cluster, tmp_path):
    """h2 without a usable Python: the launcher's interpreter and every python3 on the PATH (a pyenv shim
    included) shadowed by /dev/null inside h2's mount namespace (exec of them fails with EACCES).
    Before: `sh: 1: exec: python3: Permission denied`."""
    shims = [os.path.expanduser("~/.pyenv/shims/python3"), "/usr/local/bin/python3", "/usr/bin/python3"]
    targets = [os.path.realpath(sys.executable), *(os.path.realpath(p) for p in shims if os.path.exists(p))]
    mounted = []
    try:
        for t in targets:
            if t not in mounted:
                cluster.run(2, ["mount", "--bind", "/dev/null", t], check=True)
                mounted.append(t)
        run = launch(cluster, "-H", "h1:1,h2:1", "true", cwd=tmp_path)
        r = check(cluster, "-H", "h1:1,h2:1", cwd=tmp_path)
    finally:
        for t in reversed(mounted):
            cluster.run(2, ["umount", t])
    assert run.returncode == 3 and run.stderr.strip().splitlines() == [
        "trainrun: error: h2: python: python3 not found (pass --python)"], run.stderr
    assert r.returncode == CHECK_FAILED and "problem: h2: python: python3 not found (pass --python)" in r.stdout, r.stdout
    no_probe_server_left()


def test_missing_py_program_on_a_remote_host_is_127(cluster, tmp_path):
    """Before: Python's own `can't open file` on every rank and exit 2. The agent reports it (a FATAL frame) and
    exits: one line, 127, no host loss."""
    run = launch(cluster, "-H", "h2:2", "--workdir", str(tmp_path), "no_such_train.py", cwd=tmp_path)
    first = run.stderr.strip().splitlines()[0]
    assert run.returncode == 127, run.stderr
    assert first.startswith("trainrun: h2: rank 0 on h2: program no_such_train.py: no such file"), run.stderr
    assert "Traceback" not in run.stderr and "can't open file" not in run.stderr
    # the agent's own report is the whole story: its exit after it is no lost host (before: "lost the agent on
    # h2" and its ranks "exited with code 255" followed, and a cleanup of h2 over a new connection)
    assert "lost" not in run.stderr and "255" not in run.stderr and "new connection" not in run.stderr, run.stderr
