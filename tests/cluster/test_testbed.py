"""The simulated hosts themselves (scripts/testbed.py): what `up` tells the user, and that hosts share no
memory: each has its own /dev/shm and IPC namespace (what keeps MPI between them on their NICs; the traffic
itself is tested in test_throttle.py)."""
import os
import subprocess
import sys

testbed = sys.modules["trainrun_testbed"]   # scripts/testbed.py, as conftest.py loaded it


def test_up_prints_the_hostfile_it_wrote_and_a_launch_line(cluster):
    text = testbed.up_report(cluster, 0.3)
    lines = text.splitlines()
    assert f"hostfile {cluster.hostfile}:" in lines
    at = lines.index(f"hostfile {cluster.hostfile}:")
    assert lines[at + 1:at + 4] == ["  h1 slots=2", "  h2 slots=2", "  h3 slots=2"]
    assert cluster.hostfile.read_text() == "h1 slots=2\nh2 slots=2\nh3 slots=2\n"
    launch = lines[lines.index("launch:") + 1].split()
    assert launch[1:] == ["--ssh-config", str(cluster.ssh_config), "--hostfile", str(cluster.hostfile), "train.py"]


def ssh(cluster, host, command):
    return subprocess.run(["ssh", "-F", str(cluster.ssh_config), host, command], capture_output=True, text=True,
                          timeout=30, check=True).stdout


def test_each_host_has_its_own_dev_shm_and_ipc_namespace(cluster):
    """A file an SSH session on h1 puts in /dev/shm is seen by h1's other sessions only; every host's IPC
    namespace differs from the others' and from this machine's."""
    name = f"trainrun-testbed-{os.getpid()}"
    try:
        ssh(cluster, "h1", f"touch /dev/shm/{name}")
        assert ssh(cluster, "h1", f"ls /dev/shm/{name}").strip() == f"/dev/shm/{name}"
        assert name not in ssh(cluster, "h2", "ls /dev/shm")
        assert not os.path.exists(f"/dev/shm/{name}")
    finally:
        ssh(cluster, "h1", f"rm -f /dev/shm/{name}")
    ipc = [ssh(cluster, h.name, "readlink /proc/self/ns/ipc").strip() for h in cluster.hosts]
    assert len(set(ipc + [os.readlink("/proc/self/ns/ipc")])) == len(cluster.hosts) + 1, ipc
