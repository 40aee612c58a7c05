"""A host cut off from the network is named lost when the kernel gives up on the agent's TCP connection
(fanout/ssh.py watch_connection: TCP_USER_TIMEOUT and keepalive probes), long before --heartbeat-timeout;
and an agent that only stops answering while its host's kernel still does (SIGSTOPped, on a loaded machine)
is not taken for a cut. On the simulated hosts (scripts/testbed.py)."""
import os
import signal
import subprocess
import sys
import time
import uuid

testbed = sys.modules["trainrun_testbed"]   # scripts/testbed.py, as conftest.py loaded it

SLEEPER = "import sys, time; print('up', flush=True); time.sleep(float(sys.argv[1]))"


def argv(cluster, *args):
    return [sys.executable, "-m", "trainrun", "--ssh-config", str(cluster.ssh_config), *map(str, args)]


def the_agent_and_watchdog(cluster, i: int) -> list[int]:
    return cluster.on_host(i, testbed.procs_with("trainrun.agent"))


def test_a_cut_host_is_named_by_the_kernel_not_the_heartbeat(cluster, tmp_path):
    """h3's eth0 goes down under a job with --heartbeat-timeout 60: the launcher names h3 lost because its SSH
    connection ended (the kernel gave up on it), well before the heartbeat would (before: 'no word from the
    agent on h3' after 60 s), exit 255."""
    token = f"cutk{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(argv(cluster, "--heartbeat-timeout", 60, "--ssh-timeout", 3, "-H", "h1:1,h3:2",
                                 sys.executable, "-c", SLEEPER, "300", token),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        for _ in range(3):
            assert proc.stdout.readline().endswith(b"up\n")
        with cluster.link_down(3) as t_cut:
            out, err = proc.communicate(timeout=50)  # the heartbeat alone would take 60 s
            print(f"cut -> launcher's exit: {time.monotonic() - t_cut:.1f}s")
        text = err.decode()
        assert proc.returncode == 255, text
        assert "lost the agent on h3 (the SSH connection " in text, text
        assert "no word from the agent" not in text
    finally:
        proc.kill()
        proc.communicate()
        testbed.kill_procs_with(token)


def test_a_stopped_agent_on_a_loaded_machine_is_no_cut(cluster, tmp_path):
    """h2's agent (and its watchdog) SIGSTOPped for 4x the kernel's timeout while a CPU hog per core runs:
    its host's kernel still answers, so nothing is lost; once continued the job ends 0."""
    from trainrun.fanout.ssh import KERNEL_TIMEOUT_S

    token = f"stopk{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(argv(cluster, "--heartbeat-timeout", 60, "-H", "h1:1,h2:2",
                                 sys.executable, "-c", SLEEPER, "25", token),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    hogs, stopped = [], []
    try:
        for _ in range(3):
            assert proc.stdout.readline().endswith(b"up\n")
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass", token]) for _ in range(os.cpu_count() or 2)]
        stopped = the_agent_and_watchdog(cluster, 2)
        assert len(stopped) == 2, stopped
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(4 * KERNEL_TIMEOUT_S)
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        stopped = []
        for hog in hogs:
            hog.kill()
            hog.wait()
        hogs = []
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        assert "lost" not in err.decode()
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        for hog in hogs:
            hog.kill()
            hog.wait()
        proc.kill()
        proc.communicate()
        testbed.kill_procs_with(token)
