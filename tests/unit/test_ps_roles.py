"""--tf-cluster's pure parts: parsing, resolving against -np, placing roles over hosts, TF_CONFIG per rank."""
import json

import pytest

from trainrun.errors import UsageError
from trainrun.plan.facts import HostFacts
from trainrun.plan.envcontract import JobInfo
from trainrun.plan.hosts import HostSpec
from trainrun.plan.placement import assign_ranks
from trainrun.plan.roles import RoleCounts, Task, cluster_of, parse_roles, place_roles
from trainrun.plan.spec import build_plan


def test_parse_full_and_short_forms():
    assert parse_roles("chief=1,worker=4,ps=2,evaluator=1") == RoleCounts(ps=2, chief=1, worker=4, evaluator=1)
    assert parse_roles("ps=2") == RoleCounts(ps=2)
    assert parse_roles("ps=2").total is None and parse_roles("worker=2, ps=1").total == 4


@pytest.mark.parametrize("text, needle", [
    ("ps=0", "ps=N with N >= 1"), ("worker=3", "ps=N"), ("chief=2,ps=1", "exactly one chief"),
    ("ps=1,evaluator=2", "at most one evaluator"), ("ps=1,gpu=1", "'gpu=1'"), ("ps=x", "whole number"),
    ("ps=1,ps=2", "twice"), ("ps=1,worker=0", "at least one worker"),
])
def test_parse_rejects(text, needle):
    with pytest.raises(UsageError, match=needle):
        parse_roles(text)


def test_resolve_fills_workers_and_checks_the_sum():
    assert RoleCounts(ps=2).resolve(6).worker == 3
    with pytest.raises(UsageError, match="leave no worker among -np 3"):
        RoleCounts(ps=2).resolve(3)
    with pytest.raises(UsageError, match="add up to 7 tasks, not -np 4"):
        parse_roles("worker=4,ps=2").resolve(4)


def hosts_of(*slots):
    return [name for i, n in enumerate(slots) for name in [f"h{i + 1}"] * n]


def test_chief_is_rank_0_and_ps_spread_over_hosts():
    tasks = place_roles(parse_roles("worker=2,ps=2"), hosts_of(2, 2, 1))
    assert tasks[0] == Task("chief", 0)
    ps_hosts = [hosts_of(2, 2, 1)[r] for r, t in enumerate(tasks) if t.role == "ps"]
    assert sorted(ps_hosts) == ["h2", "h3"]  # two different hosts, not the chief's while others have room
    assert [t.index for t in tasks if t.role == "worker"] == [0, 1]


def test_one_host_takes_every_ps_and_evaluator_is_last_non_ps():
    tasks = place_roles(parse_roles("ps=2,evaluator=1"), hosts_of(6))
    assert [(t.role, t.index) for t in tasks] == [("chief", 0), ("worker", 0), ("worker", 1), ("evaluator", 0),
                                                  ("ps", 0), ("ps", 1)]


def test_never_two_ps_on_a_host_when_hosts_allow():
    tasks = place_roles(parse_roles("ps=3"), hosts_of(3, 3, 3))
    ps_hosts = [hosts_of(3, 3, 3)[r] for r, t in enumerate(tasks) if t.role == "ps"]
    assert sorted(ps_hosts) == ["h1", "h2", "h3"]


def test_more_ps_than_the_spread_allows_is_a_usage_error():
    with pytest.raises(UsageError, match="3 parameter servers cannot be spread over 3 host"):
        place_roles(parse_roles("ps=3"), hosts_of(1, 1, 4))  # h1 holds only the chief: h3 would need two


def test_tf_config_has_the_whole_cluster_and_each_task():
    hosts = [HostSpec("a", 3), HostSpec("b", 2)]
    a = assign_ranks(hosts, 5)
    tasks = place_roles(parse_roles("ps=2"), [x.host.name for x in a])
    addrs = tuple(f"10.0.0.{r}:{7000 + r}" for r in range(5))
    plan = build_plan(a, JobInfo("j", "10.0.0.0", 1, tf_workers=addrs, tf_tasks=tasks), ("p",), "/", {})
    cluster = cluster_of(tasks, addrs)
    assert set(cluster) == {"chief", "worker", "ps"} and len(cluster["ps"]) == 2
    for p in plan.procs:
        doc = json.loads(p.env["TF_CONFIG"])
        t = tasks[p.rank]
        assert doc == {"cluster": cluster, "task": {"type": t.role, "index": t.index}}
        assert (p.env["TRAINRUN_ROLE"], p.env["TRAINRUN_ROLE_INDEX"]) == (t.role, str(t.index))
        assert doc["cluster"][t.role][t.index] == addrs[p.rank]  # its own address is its own entry
        assert "TRAINRUN_ROLE" in dict(p.env)


def test_make_plan_with_roles_from_facts():
    from trainrun.config import LaunchConfig
    from trainrun.launchspec import resolve
    from trainrun.plan.planner import make_plan, shape_job

    here = HostFacts(hostname="m", cpus=2, python="p", trainrun="t", free_port=4000, worker_ports=(4001, 4002, 4003, 4004))
    spec = resolve(LaunchConfig(command=("x.py",), tf_cluster=parse_roles("worker=2,ps=1")), {})
    shape = shape_job(spec.plan, spec.hosts.hosts)
    assert shape.np == 4  # -np from the roles
    plan = make_plan(spec.plan, shape, {"localhost": here}, "127.0.0.1", environ={})
    doc = json.loads(plan.procs[3].env["TF_CONFIG"])
    assert doc["cluster"] == {"chief": ["127.0.0.1:4001"], "worker": ["127.0.0.1:4002", "127.0.0.1:4003"],
                              "ps": ["127.0.0.1:4004"]}
    assert doc["task"] == {"type": "ps", "index": 0}


def test_config_rules():
    from trainrun.config import LaunchConfig

    with pytest.raises(UsageError, match="--mpi openmpi"):
        LaunchConfig(command=("x",), tf_cluster=RoleCounts(ps=1), mpi="openmpi")
    cfg = LaunchConfig(command=("x",), tf_cluster=RoleCounts(ps=1), max_restarts=2)
    assert not cfg.elastic and cfg.ps_restarts == 2  # --max-restarts: the worker restart limit, not elastic
    assert LaunchConfig(command=("x",), tf_cluster=RoleCounts(ps=1)).ps_restarts == 3


def test_check_rows_targets_and_problem_lines():
    from trainrun.check.ps_ports import _problems, port_rows, ps_targets

    a = assign_ranks([HostSpec("a", 2), HostSpec("b", 1)], 3)
    tasks = place_roles(parse_roles("ps=1"), [x.host.name for x in a])
    workers = ("10.0.0.1:5001", "10.0.0.1:5002", "10.0.0.2:6001")
    assert port_rows(tasks, a, workers) == [("a", "chief:0 worker:0", "5001,5002"), ("b", "ps:0", "6001")]
    assert ps_targets(tasks, a, workers) == [("b", "ps 0", "10.0.0.2", 6001)]
    listened = {"b": {"listen": [["ps 0", "10.0.0.2", 6001]], "failed": []}}
    results = {"a": [["b", "ps 0", "10.0.0.2", "Connection refused"]], "b": [["b", "ps 0", "10.0.0.2", "ok"]]}
    assert _problems(listened, results) == ["a cannot reach ps 0 on b at 10.0.0.2:6001 (Connection refused); "
                                            "open that port between the hosts"]
    taken = {"b": {"listen": [], "failed": [["ps 0", "10.0.0.2", 6001, "Address already in use"]]}}
    assert "b: ps 0 cannot listen on 10.0.0.2:6001 there (Address already in use)" in _problems(taken, {})[0]


def test_local_reach_names_a_port_taken_by_another_process():
    import socket

    from trainrun.check.ps_ports import reach_problems

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        problems = reach_problems([("localhost", "ps 0", "127.0.0.1", port)], ["localhost"])
    finally:
        taken.close()
    assert len(problems) == 1 and f"ps 0 cannot listen on 127.0.0.1:{port}" in problems[0]
    assert reach_problems([("localhost", "ps 0", "127.0.0.1", port)], ["localhost"]) == []
