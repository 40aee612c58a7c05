"""horovod.ray's public names (the lists the generated Horovod API coverage page reads: scripts/docsgen.py) and
the RayExecutor's signature and argument errors as Horovod 0.28.1 has them; no Ray cluster needed (importing
horovod.ray imports no Ray)."""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest

from trainrun.plan.horovod_shim import SHIM_DIR
from trainrun.rayexec import horovod_api, ray_logger

HOROVOD_RAY = """RayExecutor BaseHorovodWorker ElasticRayExecutor ray_logger"""
HOROVOD_RAY_EXECUTOR = """create_settings start execute run run_remote execute_single shutdown"""
HOROVOD_RAY_LOGGER = """configure log"""

# Horovod 0.28.1's horovod/ray/runner.py, RayExecutor.__init__ and create_settings, in order
INIT = ("settings num_workers num_hosts num_workers_per_host cpus_per_worker use_gpu gpus_per_worker "
        "use_current_placement_group min_workers max_workers reset_limit cooldown_range elastic_timeout "
        "override_discovery").split()
CREATE_SETTINGS = "timeout_s ssh_identity_file ssh_str placement_group_timeout_s nics".split()


def test_the_names_through_the_horovod_alias_without_importing_ray():
    code = ("import json, sys; import horovod.ray as h; from horovod.ray import ray_logger; "
            "from horovod.ray.elastic import ElasticRayExecutor; "
            "print(json.dumps([sorted(n for n in sys.argv[1].split() if not hasattr(h, n)), "
            "sorted(n for n in sys.argv[2].split() if not hasattr(h.RayExecutor, n)), "
            "sorted(n for n in sys.argv[3].split() if not hasattr(ray_logger, n)), "
            "ElasticRayExecutor is h.ElasticRayExecutor, 'ray' in sys.modules]))")
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": SHIM_DIR}
    p = subprocess.run([sys.executable, "-c", code, HOROVOD_RAY, HOROVOD_RAY_EXECUTOR, HOROVOD_RAY_LOGGER], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [[], [], [], True, False]


def test_signatures_are_horovods():
    assert list(inspect.signature(horovod_api.RayExecutor.__init__).parameters)[1:] == INIT
    assert list(inspect.signature(horovod_api.RayExecutor.create_settings).parameters) == CREATE_SETTINGS
    s = horovod_api.RayExecutor.create_settings(timeout_s=45, nics={"eth1"})
    assert (s.timeout_s, s.placement_group_timeout_s, s.nics) == (45, 100, {"eth1"})
    assert all(hasattr(ray_logger, n) for n in HOROVOD_RAY_LOGGER.split())


@pytest.mark.parametrize("kwargs, words", [
    ({"max_workers": 4}, "`max_workers` provided without any positive `min_workers`"),
    ({"min_workers": 2, "num_workers": 2}, "Both `min_workers` and `num_workers` provided"),
    ({}, "give num_workers"),
    ({"num_workers": 0}, "0 workers: give at least 1"),
])
def test_bad_arguments_raise_valueerror_before_anything_starts(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        horovod_api.RayExecutor(horovod_api.RayExecutor.create_settings(), **kwargs)


def test_placement_options():
    from trainrun.rayexec.executor import Elastic, Placement, elastic_argv, engine_argv, launch_end

    assert engine_argv(Placement(4, cpus=2), "A:1") == ["--ray", "A:1", "-np", "4", "--cpus-per-proc", "2"]
    assert engine_argv(Placement(3, gpus=1, hosts=3), "A:1")[-4:] == ["--gpus-per-proc", "1", "--ray-strategy",
                                                                       "strict_spread"]
    assert engine_argv(Placement(4, hosts=2), "A:1")[-2:] == ["--ray-strategy", "spread"]
    multi = elastic_argv(Placement(2), Elastic(2, 6, None, (10, 100), 60), "A:1", nodes=3, slots=5)
    assert multi[3] == "5" and multi[6:] == ["--min-np", "2", "--max-np", "6", "--blacklist-cooldown-range", "10", "100",
                                            "--elastic-timeout", "60"]
    one = elastic_argv(Placement(2), Elastic(2, None, 1), "A:1", nodes=1, slots=8)
    assert one[3] == "2" and one[-2:] == ["--max-restarts", "1"]
    assert launch_end(7, ["x", "trainrun: rank 1 on h2 (local rank 1) exited with code 7; stopped all 2 rank(s)", "y"]) \
        == "the workers' launch ended with exit code 7: rank 1 on h2 (local rank 1) exited with code 7; stopped all 2 rank(s)"


def test_mailbox_orders_calls_waits_and_forgets():
    """The mailbox's logic without Ray (its methods are plain coroutines): calls in order per rank, a wait that
    ends on every outcome or on fail(), and a caller that has its outcomes lets the taken calls go."""
    import asyncio

    from trainrun.rayexec.mailbox import Mailbox

    async def scenario():
        box = Mailbox(2)
        assert await box.take(0, 0.01, rank=0) is None  # nothing posted yet: ask again
        first = await box.post(b"call-0", (0, 1))
        assert await box.take(first, 1, rank=0) == (b"call-0", (0, 1))
        await box.put(first, 0, b"v0", False)
        got, failed, done = await box.wait(first, 0.05)
        assert (got, failed, done) == ({0: b"v0"}, None, False)  # rank 1's outcome still missing
        waiter = asyncio.ensure_future(box.wait(first, 5))
        await box.put(first, 1, b"v1", False)
        assert await waiter == ({0: b"v0", 1: b"v1"}, None, True)
        second = await box.post(b"call-1", (0,))
        for rank in (0, 1):
            await box.take(second, 1, rank=rank)
        await box.forget(first)
        assert box.commands[first] == (b"", (0, 1)) and first not in box.outcomes
        assert box.commands[second] == (b"call-1", (0,))  # not yet run by everyone's next take
        await box.fail("the launch ended")
        assert await box.wait(second, 5) == ({}, "the launch ended", True)

    asyncio.run(scenario())
