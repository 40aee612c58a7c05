"""`trainrun --check --perf` on 4 simulated hosts: a throttled data NIC, a CPU hog and a different Python are
named; healthy hosts raise no alarm.

The hosts run this checkout's trainrun through a --python wrapper (SSH sessions carry no PYTHONPATH). The
hosts share this machine's two CPUs, so a busy loop on one simulated host slows them all alike: the hog
test pins h3's probe process and a busy loop to one CPU and gives the probe the lowest priority, so the
loop takes that CPU whatever else runs on the machine (on a real host a hog needs no such help). The probe
is an SSH session of its own, so with the kernel's autogroups it is its session's nice that must drop.
"""
import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

CHECK_FAILED = 4
REPO = Path(__file__).parents[2]
HEALTHY_RUNS = int(os.environ.get("TRAINRUN_PERF_HEALTHY_RUNS", "3"))


@pytest.fixture(scope="module")
def hosts4(cluster4, tmp_path_factory):
    """(testbed, hostfile of h1..h4 with one slot each, the --python wrapper)."""
    d = tmp_path_factory.mktemp("perf")
    wrapper = d / "python"
    wrapper.write_text(f'#!/bin/sh\nexport PYTHONPATH={REPO / "launcher"}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    hostfile = d / "hostfile"
    hostfile.write_text("".join(f"h{i} slots=1\n" for i in range(1, 5)))
    return cluster4, hostfile, wrapper


def perf(hosts4, *args, cwd, python=None, start=False):
    bed, hostfile, wrapper = hosts4
    argv = [sys.executable, "-m", "trainrun", "--ssh-config", str(bed.ssh_config), "--hostfile", str(hostfile),
            "--python", str(python or wrapper), "--no-cache", "--check", "--perf", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO / "launcher")}
    if start:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def no_probe_left():
    deadline = time.monotonic() + 5
    while subprocess.run(["pgrep", "-f", "trainrun.net.linkbench h"], capture_output=True).stdout:
        assert time.monotonic() < deadline, "the host probes --perf started must end with it"
        time.sleep(0.05)


def shape(bed, i, *qdisc):
    """tbf on both ends of host i's eth1 (its egress, and the switch side: its ingress)."""
    for ns, dev in ((bed.host(i).ns, "eth1"), ("trt-sw", f"h{i}-d")):
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", *qdisc, "dev", dev, "root",
                        *(["tbf", "rate", "40mbit", "burst", "64kb", "latency", "100ms"] if qdisc[0] == "add" else [])],
                       check=True, capture_output=True)


def test_healthy_hosts_raise_no_alarm(hosts4, tmp_path):
    """A handful of consecutive runs (TRAINRUN_PERF_HEALTHY_RUNS; scripts/bench_perf_check.py does 20)."""
    for run in range(HEALTHY_RUNS):
        r = perf(hosts4, "--perf-strict", "--json", *([] if run == 0 else ["--mpi", "none"]), cwd=tmp_path)
        doc = json.loads(r.stdout)
        found = [f["message"] for f in doc["perf"]["findings"] if f["degrades"]]
        assert r.returncode == 0 and not found, f"run {run + 1}: {found or r.stderr}"
        links = doc["perf"]["links"]
        assert set(links) == {"eth0", "eth1"}
        assert all(v is None or v > 50 for row in links["eth1"]["matrix"] for v in row)
        assert [h["host"] for h in doc["perf"]["compute"]] == ["h1", "h2", "h3", "h4"]
        if run == 0:  # the collective ran over the job's plan: 4 ranks, three sizes
            coll = doc["perf"]["collective"]
            assert coll["error"] == "" and [s["size_bytes"] for s in coll["samples"]] == [1 << 16, 1 << 20, 1 << 23]
            assert all(s["busbw_mbps"] > 0 for s in coll["samples"]) and coll["predicted_mbps"] > 0
    no_probe_left()


def test_throttled_data_nic_is_named(hosts4, tmp_path):
    bed = hosts4[0]
    shape(bed, 2, "add")
    try:
        strict = perf(hosts4, "--perf-strict", "--json", "--mpi", "none", cwd=tmp_path)
        text = perf(hosts4, "--mpi", "none", cwd=tmp_path)
    finally:
        shape(bed, 2, "del")
    assert strict.returncode == CHECK_FAILED, strict.stderr
    doc = json.loads(strict.stdout)["perf"]
    assert [(f["kind"], f["subject"]) for f in doc["findings"] if f["degrades"]] == [("link", "h2 eth1")]
    assert doc["exclude"] == "--exclude h2"
    m = doc["links"]["eth1"]["matrix"]  # ~40 Mb/s to and from h2, Gb/s elsewhere
    assert all(v < 60 for v in m[1] if v is not None) and all(m[i][1] < 60 for i in (0, 2, 3))
    assert m[0][2] > 400 and m[2][3] > 400
    assert all(v > 400 for row in doc["links"]["eth0"]["matrix"] for v in row if v is not None)
    assert text.returncode == 0, text.stderr
    row = next(line for line in text.stdout.splitlines() if line.startswith("  h2 ") and "!" in line)
    assert [c.endswith("!") for c in row.split()[1:]] == [True, False, True, True]  # h2 -> h1, -, h3, h4
    assert "degraded: h2 eth1: its links run at" in text.stdout
    assert "perf verdict: DEGRADED, 1 finding(s); to run without them: --exclude h2" in text.stdout
    no_probe_left()


def serving_probe(bed, i):
    """The pid of host i's linkbench once it listens (started up: what follows is measurement), or None."""
    out = subprocess.run(["pgrep", "-f", f"trainrun.net.linkbench h{i}$"], capture_output=True, text=True).stdout.split()
    if not out:
        return None
    ss = subprocess.run(["ip", "netns", "exec", bed.host(i).ns, "ss", "-ltnpH"], capture_output=True, text=True).stdout
    return int(out[0]) if f"pid={out[0]}," in ss else None


def test_cpu_hog_beside_the_probe_is_named(hosts4, tmp_path):
    bed = hosts4[0]
    proc = perf(hosts4, "--perf-strict", "--json", "--mpi", "none", cwd=tmp_path, start=True)
    hog, pid = None, None
    try:
        deadline = time.monotonic() + 120
        while pid is None and proc.poll() is None and time.monotonic() < deadline:
            pid = serving_probe(bed, 3)
            time.sleep(0.01)
        assert pid is not None, "h3's probe never started"
        subprocess.run(["taskset", "-a", "-p", "-c", "1", str(pid)], check=True, capture_output=True)
        subprocess.run(["renice", "-n", "19", "-p", str(pid)], check=True, capture_output=True)
        autogroup = Path(f"/proc/{pid}/autogroup")  # with autogroups, nice only ranks a session's own tasks
        if autogroup.exists():
            autogroup.write_text("19")
        hog = subprocess.Popen(bed.enter(3) + ["taskset", "-c", "1", sys.executable, "-c", "while True: pass"])
        out, err = proc.communicate(timeout=300)
    finally:
        if hog is not None:
            hog.send_signal(signal.SIGKILL)
            hog.wait()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    doc = json.loads(out)["perf"]
    assert proc.returncode == CHECK_FAILED, [(c["host"], c["gflops"]) for c in doc["compute"]]
    named = [(f["kind"], f["subject"]) for f in doc["findings"] if f["degrades"]]
    assert ("compute", "h3") in named, named
    assert not any(kind == "compute" and subject != "h3" for kind, subject in named), named
    assert "h3" in doc["exclude"]
    no_probe_left()


def test_a_host_with_another_python_is_flagged(hosts4, tmp_path):
    """--python points at this checkout's interpreter everywhere but h3, where it is a venv of Debian's python3
    (another patch release) that sees the same packages."""
    bed, _, wrapper = hosts4
    system = Path("/usr/bin/python3")
    if not system.exists():
        pytest.skip("no /usr/bin/python3 to differ with")
    other_version = subprocess.run([str(system), "-c", "import platform; print(platform.python_version())"],
                                   capture_output=True, text=True).stdout.strip()
    here = subprocess.run([sys.executable, "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True).stdout.strip()
    if other_version == here or other_version.rsplit(".", 1)[0] != here.rsplit(".", 1)[0]:
        pytest.skip(f"/usr/bin/python3 is {other_version}: needs the same minor as {here}, another patch release")
    other = tmp_path / "venv"  # Debian's python3 with this checkout and this venv's packages on its path
    made = subprocess.run([str(system), "-m", "venv", "--without-pip", str(other)], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"cannot make a venv with {system}: {made.stderr.strip()[-200:]}")
    site = subprocess.run([str(other / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "trainrun-test.pth").write_text(f"{REPO / 'launcher'}\n{sysconfig.get_paths()['purelib']}\n")
    mixed = tmp_path / "python"
    mixed.write_text(f'#!/bin/sh\n[ "$(hostname)" = h3 ] && exec {other / "bin/python"} "$@"\nexec {wrapper} "$@"\n')
    mixed.chmod(0o755)
    r = perf(hosts4, "--perf-strict", "--mpi", "none", "--perf-time", "20", cwd=tmp_path, python=mixed)
    assert r.returncode == CHECK_FAILED, r.stdout + r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("  Python "))
    assert row.split()[1:] == [here, here, other_version, "*", here]
    assert f"degraded: Python differs: h3: {other_version}; the others have {here}" in r.stdout
    assert "--exclude h3" in r.stdout.splitlines()[-1]
    no_probe_left()
