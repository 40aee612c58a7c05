"""The `cluster` fixture: 3 simulated hosts (scripts/testbed.py) for the whole test session; `cluster4`
grows it to 4 for the tests that need them.

Skips with the reason when the machine cannot host them (not root, no namespaces, no sshd), when another
session holds the testbed lock for longer than LOCK_WAIT_S, or when a testbed brought up from the command
line is in the way. Always tears the hosts down, also after failures; a testbed left behind by a killed
test session is removed first. Every test in this folder is marked `cluster`.

The `slurm` fixture: a real Slurm cluster on those hosts (scripts/slurm_testbed.py: munged + slurmctld on h1,
slurmd on every host) for the rest of the session; skips with the reason when slurm-wlm/munge are missing.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("trainrun_testbed", Path(__file__).parents[2] / "scripts/testbed.py")
testbed = sys.modules["trainrun_testbed"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(testbed)
sys.modules.setdefault("testbed", testbed)   # the name scripts/slurm_testbed.py imports it by
_spec = importlib.util.spec_from_file_location("trainrun_slurm_testbed",
                                               Path(__file__).parents[2] / "scripts/slurm_testbed.py")
slurm_testbed = sys.modules["trainrun_slurm_testbed"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(slurm_testbed)

HOSTS = 3
LOCK_WAIT_S = 120


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def cluster():
    """A testbed.Testbed with HOSTS hosts: .hosts (testbed.Host: name, mgmt_ip, data_ip, ...), .ssh_config,
    .key, .known_hosts, .hostfile (Paths), .run(i, argv) inside host i, .stop_sshd(i) / .start_sshd(i).
    Tests that stop an sshd or change files must restore them (the fixture is shared)."""
    reason = testbed.missing_requirement()
    if reason:
        pytest.skip(f"cluster tests: {reason}")
    deadline = time.monotonic() + LOCK_WAIT_S
    while (fd := testbed.lock(blocking=False)) is None:
        if time.monotonic() > deadline:
            pytest.skip(f"cluster tests: testbed busy for {LOCK_WAIT_S} s (lock {testbed.LOCK_FILE} held)")
        time.sleep(0.5)
    try:
        if testbed.namespaces():
            if (testbed.STATE_DIR / "state.json").exists() and testbed.Testbed().owner == "cli":
                pytest.skip("cluster tests: a testbed is up from the command line; "
                            "run `scripts/testbed.py down` first")
            testbed.down()  # left by a killed test session: we hold the lock, so nobody uses it
        try:
            yield testbed.up(HOSTS, owner=f"pytest:{os.getpid()}")
        finally:
            left = testbed.down()
            assert not left, f"testbed teardown left {left}"
    finally:
        os.close(fd)


@pytest.fixture(scope="session")
def slurm(cluster):
    """A slurm_testbed.Slurm on the cluster's hosts: .run(i, argv, cwd=..., env=...) / .popen(...) inside host i
    with Slurm's client env (h1 is the login node: salloc/srun/sbatch from there), .jobs(), .cancel_all(),
    .nodes(), .conf, .log_dir. Tests must leave no job behind (cancel_all in a finally)."""
    reason = slurm_testbed.missing_requirement()
    if reason:
        pytest.skip(f"slurm tests: {reason}")
    sl = slurm_testbed.up(cluster)
    try:
        yield sl
    finally:
        left = slurm_testbed.down(cluster.state_dir)
        assert not left, f"slurm teardown left {left}"


@pytest.fixture(scope="session")
def cluster4(cluster):
    """The session's testbed grown to 4 hosts (h4 added on first use; `cluster.hostfile` still lists h1..h3)."""
    return testbed.grow(4)
