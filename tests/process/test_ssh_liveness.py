"""The kernel, not the heartbeat, notices a dead connection (issue 31 item 3): with fanout/ssh.watch_connection's
options (TCP_USER_TIMEOUT, keepalive probes) a TCP connection whose other end stops answering ends within
seconds, with beats going out or none (the default kernel settings keep it for ~15 minutes), and one whose
other end is only a stopped process does not end (its kernel still answers: no false alarm for a paused or
loaded host). Real sockets in a private network namespace (tests/process/workers/tcp_liveness.py); the whole
path through SSH on the simulated hosts is tests/cluster/test_cut_detection.py."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = str(Path(__file__).parent / "workers" / "tcp_liveness.py")
LAUNCHER = str(Path(__file__).parents[2] / "launcher")

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("iptables"),
                                reason="needs root, unshare and iptables (a private network namespace that drops packets)")


def run(mode: str, beats: str) -> str:
    r = subprocess.run(["unshare", "-n", sys.executable, WORKER, mode, beats], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": LAUNCHER})
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.parametrize("beats", ["send", "idle"])
def test_a_peer_that_stops_answering_ends_the_connection(beats):
    from trainrun.fanout.ssh import KERNEL_TIMEOUT_S

    out = run("cut", beats)
    assert out.startswith("ended "), out
    assert float(out.split()[1]) < KERNEL_TIMEOUT_S + 3.0, out  # the kernel's own limit, not ~15 minutes


@pytest.mark.parametrize("beats", ["send", "idle"])
def test_a_stopped_peer_whose_kernel_answers_keeps_the_connection(beats):
    assert run("stopped", beats) == "alive"
