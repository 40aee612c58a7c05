import json

from trainrun.facts.gpus import gpu_pool, parse_nvidia_smi
from trainrun.plan.envcontract import JobInfo, rank_env
from trainrun.plan.hosts import HostSpec
from trainrun.plan.placement import assign_ranks
from trainrun.plan.render import plan_json, plan_table, redacted
from trainrun.plan.spec import build_plan

JOB = JobInfo("job1", "10.0.0.1", 29500)


def test_rank_env_contract():
    a = assign_ranks([HostSpec("a", 2), HostSpec("b", 2)], 4)[3]
    env = rank_env(a, JOB)
    assert env == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "1",
        "NNODES": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TRAINRUN_RANK": "3",
        "TRAINRUN_SIZE": "4", "TRAINRUN_LOCAL_RANK": "1", "TRAINRUN_LOCAL_SIZE": "2",
        "TRAINRUN_CROSS_RANK": "1", "TRAINRUN_CROSS_SIZE": "2", "TRAINRUN_HOSTNAME": "b", "TRAINRUN_JOB_ID": "job1",
    }


def test_gpu_and_nic_env():
    a = assign_ranks([HostSpec("a", 2)], 2, gpu_pools={"a": (0, 1)})[1]
    shared = rank_env(a, JOB)
    assert shared["TRAINRUN_GPUS"] == "1" and "CUDA_VISIBLE_DEVICES" not in shared
    iso = rank_env(a, JobInfo("j", "x", 1, nics=("eth1", "eth0"), isolate_gpus=True))
    assert iso["CUDA_VISIBLE_DEVICES"] == "1"
    assert iso["NCCL_SOCKET_IFNAME"] == iso["GLOO_SOCKET_IFNAME"] == iso["UCX_NET_DEVICES"] == "eth1,eth0"


def test_the_runtime_accepts_the_contract_rank_env_writes_and_names_a_wrong_coordinate():
    from dataclasses import replace

    import pytest

    from trainrun.runtime.topology import Topology, check_env

    a = assign_ranks([HostSpec("a", 2), HostSpec("b", 2)], 4)[2]
    topo = Topology(a.rank, a.size, a.local_rank, a.local_size, a.cross_rank, a.cross_size)
    check_env(topo, rank_env(a, JOB))
    check_env(topo, {})  # not started by trainrun: nothing to check
    with pytest.raises(RuntimeError, match="TRAINRUN_CROSS_RANK=1 but MPI says 0"):
        check_env(replace(topo, cross_rank=0), rank_env(a, JOB))


def test_plan_table_and_json():
    plan = build_plan(assign_ranks([HostSpec("a", 2)], 2), JOB, ("python", "t.py", "--x", "a b"), "/w", {"API_TOKEN": "s3cret", "FOO": "1"})
    text = plan_table(plan)
    assert "python t.py --x 'a b'" in text and "s3cret" not in text and "API_TOKEN=<redacted>" in text
    doc = json.loads(plan_json(plan))
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert doc["ranks"][1]["env"]["LOCAL_RANK"] == "1" and doc["ranks"][1]["argv"][-1] == "a b"
    assert "s3cret" not in plan_json(plan)


def test_redacted():
    assert redacted({"WANDB_API_KEY": "x", "HF_TOKEN": "y", "DB_PASSWORD": "z", "LR": "1"}) == {
        "WANDB_API_KEY": "<redacted>", "HF_TOKEN": "<redacted>", "DB_PASSWORD": "<redacted>", "LR": "1"}


def test_gpu_detection_parsing():
    gpus = parse_nvidia_smi("0, NVIDIA H100 80GB HBM3, 81559\n1, NVIDIA H100 80GB HBM3, 81559\n")
    assert [(g.index, g.memory_mib) for g in gpus] == [(0, 81559), (1, 81559)]
    assert gpu_pool(gpus, None) == (0, 1)
    assert gpu_pool(gpus, "1") == (1,)
    assert gpu_pool(gpus, "") == ()


def test_exported_env_wins_over_derived():
    job = JobInfo("j", "x", 1, nics=("eth0",))
    plan = build_plan(assign_ranks([HostSpec("a", 1)], 1), job, ("p",), "/w", {"NCCL_SOCKET_IFNAME": "ib0"})
    assert plan.procs[0].env["NCCL_SOCKET_IFNAME"] == "ib0" and plan.procs[0].env["UCX_NET_DEVICES"] == "eth0"


def test_tf_config_lists_every_worker_and_this_ranks_index():
    import json

    from trainrun.plan.facts import HostFacts
    from trainrun.plan.planner import tf_workers

    two = assign_ranks([HostSpec("a", 1), HostSpec("b", 1)], 2)[1]
    doc = json.loads(rank_env(two, JobInfo("j", "x", 1, tf_workers=("10.0.0.1:5000", "10.0.0.2:6000")))["TF_CONFIG"])
    assert doc == {"cluster": {"worker": ["10.0.0.1:5000", "10.0.0.2:6000"]}, "task": {"type": "worker", "index": 1}}
    here = HostFacts(hostname="m", cpus=2, python="p", trainrun="t", free_port=4000, worker_ports=(4001, 4002))
    a = assign_ranks([HostSpec("localhost", 2), HostSpec("127.0.0.1", 2)], 4)
    workers = tf_workers(a, {"localhost": here, "127.0.0.1": here}, {"localhost": "127.0.0.1", "127.0.0.1": "127.0.0.1"})
    assert len(set(workers)) == 4  # two entries for one machine: no port twice
    assert workers[:2] == ("127.0.0.1:4001", "127.0.0.1:4002") and workers[2:] == ("127.0.0.1:4003", "127.0.0.1:4004")


def test_allow_gpu_sharing_sends_cuda_collectives_through_mpi():
    """--allow-gpu-sharing with two ranks on one GPU sets TRAINRUN_GPU_OPERATIONS=mpi for every rank (NCCL
    refuses two ranks on one GPU), unless the user chose; a job whose ranks each have a GPU gets nothing."""
    from types import SimpleNamespace

    from trainrun.plan.planner import gpu_operations
    shared = assign_ranks([HostSpec("a", 2)], 2, gpu_pools={"a": (0,)}, allow_gpu_sharing=True)
    own = assign_ranks([HostSpec("a", 2)], 2, gpu_pools={"a": (0, 1)})
    flag = SimpleNamespace(allow_gpu_sharing=True)
    assert gpu_operations(flag, shared, {}) == "mpi"
    assert gpu_operations(flag, shared, {"TRAINRUN_GPU_OPERATIONS": "nccl"}) == ""
    assert gpu_operations(flag, shared, {"HOROVOD_GPU_OPERATIONS": "nccl"}) == ""
    assert gpu_operations(flag, own, {}) == ""
    assert gpu_operations(SimpleNamespace(allow_gpu_sharing=False), shared, {}) == ""
    job = JobInfo("j", "x", 1, gpu_operations="mpi")
    assert all(rank_env(a, job)["TRAINRUN_GPU_OPERATIONS"] == "mpi" for a in shared)
    assert "TRAINRUN_GPU_OPERATIONS" not in rank_env(shared[0], JOB)
    assert JobInfo.from_arg(job.to_arg()) == job  # the Open MPI rank shim's copy keeps it


def test_nccl_shared_gpu_groups():
    from trainrun.runtime.backends.nccl import shared_gpus
    assert shared_gpus([("a", "GPU-1"), ("a", "GPU-2"), ("b", "GPU-1")]) == []
    assert shared_gpus([("a", "GPU-1"), ("b", "GPU-1"), ("a", "GPU-1")]) == [(0, 2)]


def test_check_gpu_summary_and_shortage():
    """--check shows each host's GPU model, memory and driver; too few GPUs is a problem only when
    --gpus-per-proc asked for them (else a warning)."""
    from trainrun.check.report import HostCheck, evaluate, gpu_summary
    from trainrun.plan.facts import HostFacts
    from trainrun.version import __version__
    f = HostFacts("h", 16, "python3", __version__, gpus=(0,), gpu_models=("NVIDIA H100 80GB HBM3",),
                  gpu_memory_mib=(81559,), cuda_driver="580.159.04", mpi="MPICH", vendor="MPICH")
    assert gpu_summary(f) == "1 x NVIDIA H100 80GB HBM3 (81559 MiB, driver 580.159.04)"
    assert gpu_summary(HostFacts("h", 2, "p", __version__)) == "0"
    assert HostFacts.from_json(json.loads(json.dumps(f.to_json()))) == f
    hosts = [HostCheck("h", 2, facts=f, via="local")]
    kw = dict(need_nic=False, allow_gpu_sharing=False, mpi=True)
    problems, warnings = evaluate(hosts, [], {"h": 2}, gpus_per_proc=None, **kw)
    assert problems == [] and "2 local ranks share 1 GPU(s)" in warnings[0]
    problems, _ = evaluate(hosts, [], {"h": 2}, gpus_per_proc=1, **kw)
    assert "2 GPU(s) needed" in problems[0]
    assert evaluate(hosts, [], {"h": 2}, gpus_per_proc=1, **{**kw, "allow_gpu_sharing": True}) == ([], [])


def test_plan_memory_is_linear_in_ranks():
    """Every rank's TF_CONFIG lists every worker: built eagerly per rank, a plan of N ranks held N^2 bytes
    (before: 3 GB for 16000 ranks, ~450 MB for the 5000 here). Now they share one JobEnv and build on read."""
    import tracemalloc

    n = 5000
    a = assign_ranks([HostSpec(f"n{i}", 8) for i in range(n // 8 + 1)], n)
    job = JobInfo("j", "10.0.0.1", 1, tf_workers=tuple(f"10.0.{i // 250}.{i % 250}:2222" for i in range(n)))
    tracemalloc.start()
    try:
        plan = build_plan(a, job, ("python", "t.py"), "/w", {"FOO": "1"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"planning {n} ranks took {peak >> 20} MiB"
    assert all(p.env.shared is plan.procs[0].env.shared for p in plan.procs)
    for r in (0, 1234, n - 1):
        got = dict(plan.procs[r].env)
        assert got == {**rank_env(a[r], job), "FOO": "1"}
        assert json.loads(got["TF_CONFIG"])["task"]["index"] == r and len(json.loads(got["TF_CONFIG"])["cluster"]["worker"]) == n


def test_rank_env_map_reads_like_the_dict():
    """What the effects do with a plan's env (`in`, get, items, {**env}) sees exactly rank_env plus -x, -x winning."""
    a = assign_ranks([HostSpec("a", 2), HostSpec("b", 2)], 4, gpu_pools={"b": (0, 1)})
    job = JobInfo("j", "x", 1, nics=("eth1",), isolate_gpus=True, slurm=True, tf_workers=("a:1", "a:2", "b:1", "b:2"))
    plan = build_plan(a, job, ("p",), "/w", {"UCX_NET_DEVICES": "mine"})
    env = plan.procs[3].env
    want = {**rank_env(a[3], job), "UCX_NET_DEVICES": "mine"}
    assert {**env} == dict(env.items()) == want and len(env) == len(want) and sorted(env) == sorted(want)
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["SLURM_PROCID"] == "3" and "TF_CONFIG" in env
    assert "CUDA_VISIBLE_DEVICES" not in plan.procs[0].env and env.get("NOPE") is None


def test_plan_json_gives_tf_config_once():
    """Before: every rank's env in --dry-run --json carried a TF_CONFIG listing every worker (N^2 output)."""
    a = assign_ranks([HostSpec("a", 3)], 3)
    job = JobInfo("j", "x", 1, tf_workers=("a:1", "a:2", "a:3"))
    doc = json.loads(plan_json(build_plan(a, job, ("p",), "/w", {})))
    assert doc["tf_workers"] == ["a:1", "a:2", "a:3"]
    assert all("TF_CONFIG" not in r["env"] and r["env"]["RANK"] == str(r["rank"]) for r in doc["ranks"])


def test_an_elastic_attempts_env_stays_linear_in_ranks():
    """Each elastic attempt adds TRAINRUN_RESTART_COUNT/TRAINRUN_ELASTIC to every rank (elasticjob/loop.py). Before,
    that built every rank's env as a dict up front, TF_CONFIG and all: N^2 bytes (~480 MiB for the 5000 here).
    Now the two join the shared JobEnv, winning over -x exports as before."""
    import tracemalloc

    from trainrun.plan.spec import with_env

    n = 5000
    a = assign_ranks([HostSpec(f"n{i}", 8) for i in range(n // 8 + 1)], n)
    job = JobInfo("j", "10.0.0.1", 1, tf_workers=tuple(f"10.0.{i // 250}.{i % 250}:2222" for i in range(n)))
    plan = build_plan(a, job, ("python", "t.py"), "/w", {"FOO": "1", "TRAINRUN_ELASTIC": "mine"})
    tracemalloc.start()
    try:
        attempt = with_env(plan, {"TRAINRUN_RESTART_COUNT": "2", "TRAINRUN_ELASTIC": "1"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"an attempt's env for {n} ranks took {peak >> 20} MiB"
    assert all(p.env.shared is attempt.procs[0].env.shared for p in attempt.procs)
    for r in (0, 4321, n - 1):
        assert dict(attempt.procs[r].env) == {**rank_env(a[r], job), "FOO": "1", "TRAINRUN_RESTART_COUNT": "2",
                                              "TRAINRUN_ELASTIC": "1"}
    assert "TRAINRUN_RESTART_COUNT" not in plan.procs[0].env  # the plan it came from is unchanged
