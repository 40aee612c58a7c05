"""The Slurm engine meets a host as the SSH engine does (`slurm` fixture: real slurmctld/slurmd per simulated
host): the interpreter pick with its one-line errors (fanout/python_pick.py). Everything starts from h1, the login node."""
from __future__ import annotations

import os
import sys

from tests.cluster.test_slurm_launch import TRAINRUN, jobs_cancelled  # noqa: F401 (fixture)


def test_a_python_path_missing_on_the_host_is_named_not_replaced(slurm, tmp_path, jobs_cancelled):  # noqa: F811
    """Before: the step's shell took python3 in its place (and that one has no trainrun)."""
    p = slurm.run(1, ["salloc", "-N2", *TRAINRUN, "--engine", "slurm", "-H", "h2:1", "--python", "/opt/nowhere/bin/python3",
                      "true"], cwd=tmp_path, timeout=120)
    lines = [ln for ln in p.stderr.strip().splitlines() if not ln.startswith("salloc:")]
    assert p.returncode == 3 and lines == [
        "trainrun: error: h2: python: --python /opt/nowhere/bin/python3: no such interpreter there "
        "(check the path given to --python)"], p.stderr


def test_no_python_on_the_host_is_one_line(slurm, cluster, tmp_path, jobs_cancelled):  # noqa: F811
    """h2's interpreters shadowed by /dev/null in its mount namespace (where its slurmd runs the steps).
    Before: the shell's `exec: python3: Permission denied`."""
    shims = [os.path.expanduser("~/.pyenv/shims/python3"), "/usr/local/bin/python3", "/usr/bin/python3"]
    targets = [os.path.realpath(sys.executable), *(os.path.realpath(p) for p in shims if os.path.exists(p))]
    mounted = []
    try:
        for t in targets:
            if t not in mounted:
                cluster.run(2, ["mount", "--bind", "/dev/null", t], check=True)
                mounted.append(t)
        p = slurm.run(1, ["salloc", "-N2", *TRAINRUN, "--engine", "slurm", "-H", "h2:1", "true"], cwd=tmp_path, timeout=120)
    finally:
        for t in reversed(mounted):
            cluster.run(2, ["umount", t])
    lines = [ln for ln in p.stderr.strip().splitlines() if not ln.startswith("salloc:")]
    assert p.returncode == 3 and lines == ["trainrun: error: h2: python: python3 not found (pass --python)"], p.stderr
