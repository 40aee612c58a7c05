"""Straggler detection across simulated hosts: 4 hosts x 2 ranks train a small torch model under
DistributedOptimizer; both ranks of h3 sleep 0.1 s more per step (a slow host). The launcher must
name the host (not one of its ranks) within 30 s of training start, from window summaries that its
agents relay as PROGRESS frames, and advise `--exclude h3` at the end."""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import trainrun

pytestmark = pytest.mark.timeout(400)

testbed = sys.modules["trainrun_testbed"]   # scripts/testbed.py, as conftest.py loaded it
JOB = str(Path(__file__).parents[1] / "process" / "workers" / "straggler_job.py")
SRC = str(Path(trainrun.__file__).parents[1])
DETECT_S = 30.0


def test_a_slow_host_is_named_within_30_s(cluster4, tmp_path):
    cluster = cluster4
    wrapper = tmp_path / "python-here"  # the ranks' env: this checkout, and which host is slow
    wrapper.write_text(f"#!/bin/sh\nexport PYTHONPATH={SRC} SLOW_HOSTS=h3 SLOW_S=0.1 SECONDS_TO_RUN=45\n"
                       f"exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    argv = [sys.executable, "-m", "trainrun", "--ssh-config", str(cluster.ssh_config), "--python", str(wrapper),
            "-H", "h1:2,h2:2,h3:2,h4:2", str(wrapper), JOB]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": SRC}, start_new_session=True)
    err, started, out = [], [], []
    t = testbed.timed_lines(proc.stderr, err)
    try:
        for line in iter(proc.stdout.readline, b""):
            text = line.decode(errors="replace").rstrip("\n")
            out.append(text)
            if text.endswith("started"):
                started.append(time.monotonic())
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    t.join(10)
    stderr = "\n".join(line for _, line in err)
    assert rc == 0, stderr
    assert len(started) == 8, out
    named = [(at - max(started), line) for at, line in err if "trainrun: straggler: host" in line
             or "trainrun: straggler: rank" in line]
    assert named, stderr
    after, line = named[0]
    assert re.match(r"trainrun: straggler: host h3 \(ranks 4, 5\): its ranks were last to \d+%", line), stderr
    assert after < DETECT_S, f"named {after:.1f} s after training began: {line}"
    assert "--exclude h3" in stderr
