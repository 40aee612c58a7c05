"""--tf-cluster at the command line: --dry-run shows every task's role, index, host and address (table and
JSON), the YAML key works, and each bad input is one error line with exit 2."""
import json

import pytest
from launch_helpers import assert_one_line_error

pytestmark = pytest.mark.timeout(60)


def test_dry_run_table_shows_roles_and_addresses(run_trainrun):
    run = run_trainrun("-np", "5", "--tf-cluster", "ps=2", "--dry-run", "python", "-c", "pass")
    assert run.rc == 0, run.stderr
    rows = [line.split() for line in run.stdout.splitlines()[1:6]]
    assert [r[1] for r in rows] == ["chief:0", "worker:0", "worker:1", "ps:0", "ps:1"]
    assert all(r[2].startswith("127.0.0.1:") and r[3] == "localhost" for r in rows)
    assert "mpi: none" in run.stdout and '"ps": ["127.0.0.1:' in run.stdout


def test_dry_run_json_on_three_hosts_and_yaml_key(run_trainrun, tmp_path):
    cfg = tmp_path / "ps.yaml"
    cfg.write_text("tf-cluster: {chief: 1, worker: 2, ps: 2}\nhosts: localhost:2,127.0.0.1:2,h3:1\n")
    run = run_trainrun("--config", str(cfg), "--dry-run", "--json", "python", "-c", "pass")
    assert run.rc == 0, run.stderr
    doc = json.loads(run.stdout)
    tasks = [(r["rank"], r["role"], r["role_index"], r["host"]) for r in doc["ranks"]]
    assert tasks[0] == (0, "chief", 0, "localhost")
    assert sorted(h for _, role, _, h in tasks if role == "ps") == ["127.0.0.1", "h3"]
    assert doc["tf_cluster"]["ps"] == [r["address"] for r in doc["ranks"] if r["role"] == "ps"]
    assert all(r["env"]["TRAINRUN_ROLE"] == r["role"] for r in doc["ranks"])


@pytest.mark.parametrize("args, needle", [
    (["-np", "4", "--tf-cluster", "chief=1,worker=4,ps=2"], "add up to 7 tasks, not -np 4"),
    (["-np", "3", "--tf-cluster", "ps=2"], "leave no worker"),
    (["-H", "localhost:1,127.0.0.1:1,127.0.0.2:4", "--tf-cluster", "ps=3"], "cannot be spread over 3 host"),
    (["-np", "4", "--tf-cluster", "ps=1", "--mpi", "openmpi"], "--mpi openmpi"),
    (["-np", "4", "--tf-cluster", "ps=1,gpu=2"], "'gpu=2' is not ROLE=N"),
])
def test_bad_roles_are_one_line_exit_2(run_trainrun, args, needle):
    run = run_trainrun(*args, "--dry-run", "python", "-c", "pass")
    assert_one_line_error(run, 2, needle, "--tf-cluster")


def test_help_has_one_line_for_the_option(run_trainrun):
    run = run_trainrun("--help")
    assert "--tf-cluster" in run.stdout and "parameter-server" in run.stdout


def test_check_lists_the_ports_and_reaches_every_ps(run_trainrun):
    run = run_trainrun("-np", "5", "--tf-cluster", "ps=2", "--check", "--json", timeout=60)
    assert run.rc == 0, run.stderr
    doc = json.loads(run.stdout)
    [row] = doc["tf_cluster"]
    assert row["tasks"] == "chief:0 worker:0 worker:1 ps:0 ps:1" and len(row["ports"].split(",")) == 5
    assert doc["ok"], doc["problems"]
