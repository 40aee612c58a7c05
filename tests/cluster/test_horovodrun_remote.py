"""horovodrun and trainrun.run across simulated SSH hosts: the tutorial's second command line as written
(the testbed's port 22 for its 2222; eth0 is a NIC every testbed host has), and a function on ranks of
two hosts with its values and a remote rank's exception coming back."""
import os
import shutil
import socket
import subprocess
import sys

import pytest

import trainrun

TRAIN = """
import os, socket, numpy as np
import trainrun.numpy as hvd
hvd.init()
total = hvd.allreduce(np.array([float(hvd.rank())]), op=hvd.Sum)
print("rank", hvd.rank(), "of", hvd.size(), "on", socket.gethostname(), "sum", int(total[0]), "nic", os.environ.get("UCX_NET_DEVICES"))
"""


def user_home(cluster, tmp_path):
    """A HOME whose ~/.ssh/config is the testbed's (how a user reaches their hosts without trainrun flags)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(cluster.ssh_config, home / ".ssh" / "config")
    return home


def test_tutorial_second_command_line(cluster, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    shutil.copy(cluster.hostfile, tmp_path / "hostfile")
    env = dict(os.environ, HOME=str(user_home(cluster, tmp_path)),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])  # `python` = this one, on every host
    argv = [sys.executable, "-m", "trainrun.horovodrun",
            *"--verbose --network-interface eth0 --hostfile hostfile -p 22 -np 4 python train.py".split()]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    lines = sorted(line for line in r.stdout.splitlines() if "<stdout>:rank" in line)
    assert lines == [f"[1,{k}]<stdout>:rank {k} of 4 on h{k // 2 + 1} sum 6 nic eth0" for k in range(4)]
    assert "h2" in r.stderr  # --verbose: the launcher says what it does


def where(fail_on=None):
    if os.environ["TRAINRUN_HOSTNAME"] == fail_on and os.environ["LOCAL_RANK"] == "1":
        raise OSError("disk full on " + socket.gethostname())
    return int(os.environ["RANK"]), socket.gethostname()


def test_run_function_on_two_hosts(cluster):
    opts = dict(np=4, hosts="h1:2,h2:2", ssh_config=str(cluster.ssh_config))
    assert trainrun.run(where, **opts) == [(0, "h1"), (1, "h1"), (2, "h2"), (3, "h2")]
    with pytest.raises(trainrun.RankError) as info:
        trainrun.run(where, ("h2",), **opts)
    assert (info.value.rank, info.value.host) == (3, "h2")
    assert "disk full on h2" in str(info.value) and 'raise OSError("disk full on "' in info.value.traceback
