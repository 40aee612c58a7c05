"""The Ray engine's pure parts and `--ray`'s refusals, without a Ray cluster (tests/cluster/ray runs it on one)."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from trainrun.cli.command import ray_default_address
from trainrun.config import parse_config
from trainrun.errors import UsageError
from trainrun.fanout.ray_actor import child_env
from trainrun.fanout.ray_engine import RayRequest, bundles_for, gcs_endpoint, hosts_of, resolve_address
from trainrun.plan.hosts import HostSpec


def test_one_bundle_per_rank_with_cpus_and_gpus():
    assert bundles_for(RayRequest(np=3, cpus_per_proc=2.0)) == [{"CPU": 2.0}] * 3
    assert bundles_for(RayRequest(np=2, gpus_per_proc=1)) == [{"CPU": 1.0, "GPU": 1.0}] * 2


def test_hosts_in_the_order_of_their_first_bundle_named_by_ip():
    placed = hosts_of({0: "n2", 1: "n2", 2: "n1", 3: "n3", 4: "n1"}, {"n1": "10.0.0.1", "n2": "10.0.0.2", "n3": "10.0.0.3"})
    assert placed == [("10.0.0.2", "n2", [0, 1]), ("10.0.0.1", "n1", [2, 4]), ("10.0.0.3", "n3", [3])]


def test_two_nodes_on_one_ip_get_distinct_names():
    names = [name for name, _, _ in hosts_of({0: "aaaaaaaaaa", 1: "bbbbbbbbbb"}, {"aaaaaaaaaa": "10.0.0.1",
                                                                                 "bbbbbbbbbb": "10.0.0.1"})]
    assert names == ["10.0.0.1/aaaaaaaa", "10.0.0.1/bbbbbbbb"]


def test_a_ray_host_is_never_this_machine():
    assert HostSpec("127.0.0.1", 2).is_local
    assert not HostSpec("127.0.0.1", 2, via="ray").is_local


def test_addresses():
    assert resolve_address("auto", {"RAY_ADDRESS": "h:6379"}) == "h:6379"
    assert resolve_address("auto", {}) == "auto"
    assert resolve_address("x:1", {"RAY_ADDRESS": "h:6379"}) == "x:1"
    assert gcs_endpoint("10.0.0.1:6379") == ("10.0.0.1", 6379)
    assert gcs_endpoint("ray://head:10001") == ("head", 10001)
    assert gcs_endpoint("local") is None
    assert gcs_endpoint("auto", current_cluster="/nonexistent") is None


def test_a_childs_environment_drops_rays_worker_settings():
    env = child_env({"PATH": "/bin", "RAY_RAYLET_PID": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""},
                    {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1"}


@pytest.mark.parametrize("argv, want", [
    (["--ray", "train.py", "--lr", "1"], ["--ray", "auto", "train.py", "--lr", "1"]),
    (["-np", "2", "--ray", "train.py"], ["-np", "2", "--ray", "auto", "train.py"]),
    (["--ray", "-np", "2", "x"], ["--ray", "-np", "2", "x"]),
    (["--ray", "head:6379", "-np", "2", "x"], ["--ray", "head:6379", "-np", "2", "x"]),
    (["-np", "2", "python", "--ray", "x"], ["-np", "2", "python", "--ray", "x"]),
])
def test_ray_without_address_before_the_program(argv, want):
    assert ray_default_address(argv) == want


@pytest.mark.parametrize("options, words", [
    ({"ray": "auto", "hosts": "a,b", "num_proc": 2}, "-H/--hostfile"),
    ({"ray": "auto", "num_proc": 2, "mpi": "openmpi"}, "--mpi openmpi"),
    ({"ray": "auto", "num_proc": 2, "check": True}, "--check"),
    ({"ray": "auto", "num_proc": 2, "dry_run": True}, "--dry-run"),
    ({"ray": "auto", "num_proc": 2, "engine": "ssh"}, "--engine ssh"),
    ({"ray": "auto"}, "-np"),
    ({"ray": "train.py", "num_proc": 2}, "not a Ray address"),
    ({"num_proc": 2, "cpus_per_proc": 2.0}, "go with --ray"),
    ({"num_proc": 2, "ray_strategy": "spread"}, "go with --ray"),
])
def test_refusals_are_one_line(options, words):
    with pytest.raises(UsageError) as err:
        parse_config(["x"], **options)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_an_address_that_does_not_answer_is_one_line_and_exit_3_at_once():
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "trainrun", "--ray", "127.0.0.1:1", "-np", "2", "true"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, p.stderr
    assert p.stderr.startswith("trainrun: error: ray: connect: 127.0.0.1:1") and p.stderr.count("\n") == 1, p.stderr
    assert time.monotonic() - started < 20


def test_help_does_not_import_ray():
    code = "import sys; from trainrun.cli.command import main\ntry:\n    main(['--help'])\nexcept SystemExit: pass\n" \
           "print('ray' in sys.modules, file=sys.stderr)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "--ray" in p.stdout and p.stderr.strip().endswith("False"), p.stderr


def test_run_api_ray_option():
    from trainrun.runfunc.api import _option_argv

    assert _option_argv({"ray": True, "num_proc": 2}) == ["--ray", "--num-proc", "2"]
    assert _option_argv({"ray": "head:6379", "num_proc": 2}) == ["--ray", "head:6379", "--num-proc", "2"]
    with pytest.raises(UsageError, match="not a Ray address"):
        _option_argv({"ray": "train.py", "num_proc": 2})


def test_no_ray_installed_is_one_line():
    code = ("import sys; sys.modules['ray'] = None\nfrom trainrun.cli.command import main\n"
            "main(['--ray', '127.0.0.1:1', '-np', '2', 'true'])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("trainrun: error: --ray: Ray is not installed here") and p.stderr.count("\n") == 1, p.stderr
