"""trainrun/_horovod: which horovod a rank imports (the choice), the PYTHONPATH the host that starts a rank gives
it, and that the shim ships as packages. Pure. (Imports through the shim: tests/horovod_compat/.)"""
import os

import pytest
from setuptools import find_packages

from trainrun.plan.horovod_shim import SHIM_DIR, choice, rank_env
from trainrun.plan.envcontract import JobInfo
from trainrun.plan.hosts import HostSpec
from trainrun.plan.placement import assign_ranks
from trainrun.plan.spec import build_plan
from trainrun.supervisor.local import host_env

LAUNCHER = os.path.dirname(os.path.dirname(SHIM_DIR))  # launcher/, where setup.cfg finds packages


def test_choice_default_env_and_option():
    assert choice({}) == "trainrun"
    assert choice({"TRAINRUN_HOROVOD": "installed"}) == "installed"
    assert choice({"TRAINRUN_HOROVOD": "installed"}, "trainrun") == "trainrun"  # --horovod wins
    with pytest.raises(ValueError, match="TRAINRUN_HOROVOD='real': use one of trainrun, installed"):
        choice({"TRAINRUN_HOROVOD": "real"})


def test_the_shim_goes_first_on_pythonpath_once():
    assert rank_env({})["PYTHONPATH"] == SHIM_DIR
    env = rank_env({"PYTHONPATH": f"/a{os.pathsep}/b", "X": "1"}, shim_dir="/s")
    assert env == {"PYTHONPATH": f"/s{os.pathsep}/a{os.pathsep}/b", "X": "1"}
    assert rank_env(env, shim_dir="/s") == env  # a rank that starts ranks (elastic, nested) does not stack it


def test_installed_leaves_the_shim_out():
    env = {"TRAINRUN_HOROVOD": "installed", "PYTHONPATH": "/a"}
    assert rank_env(env) == env
    assert rank_env({"TRAINRUN_HOROVOD": "installed"}) == {"TRAINRUN_HOROVOD": "installed"}
    # a launch from inside a rank: the shim inherited on PYTHONPATH goes
    nested = {"TRAINRUN_HOROVOD": "installed", "PYTHONPATH": f"/s{os.pathsep}/a"}
    assert rank_env(nested, shim_dir="/s") == {"TRAINRUN_HOROVOD": "installed", "PYTHONPATH": "/a"}


def test_the_host_that_starts_a_rank_adds_its_own_shim():
    plan = build_plan(assign_ranks([HostSpec("h", 2)], 2), JobInfo("j", "h", 1), ("python", "t.py"), "/w",
                      {"TRAINRUN_HOROVOD": "trainrun"})
    env = host_env(plan.procs[0], {"PYTHONPATH": "/user"}, 2)
    assert env["PYTHONPATH"] == f"{SHIM_DIR}{os.pathsep}/user"
    installed = build_plan(assign_ranks([HostSpec("h", 1)], 1), JobInfo("j", "h", 1), ("python", "t.py"), "/w",
                           {"TRAINRUN_HOROVOD": "installed"})
    assert host_env(installed.procs[0], {"PYTHONPATH": "/user"}, 2)["PYTHONPATH"] == "/user"


def test_the_shim_ships_as_packages():
    """setup.cfg's `packages = find:` must see every shim package, or a wheel install would lack them."""
    found = set(find_packages(LAUNCHER))
    shim = {os.path.relpath(d, LAUNCHER).replace(os.sep, ".") for d, _, files in os.walk(SHIM_DIR)
            if "__init__.py" in files}
    assert {"trainrun._horovod.horovod.torch.elastic", "trainrun._horovod.horovod.tensorflow.keras"} <= shim
    assert shim <= found
