"""What a rank gets: the env contract, its argv, the interpreter, -x exports, OMP_NUM_THREADS, CPU binding."""
import os
import sys
from pathlib import Path

import pytest
from launch_helpers import base_env, worker

pytestmark = pytest.mark.timeout(60)

CONTRACT = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES", "MASTER_ADDR",
            "MASTER_PORT", "TRAINRUN_RANK", "TRAINRUN_SIZE", "TRAINRUN_LOCAL_RANK", "TRAINRUN_LOCAL_SIZE",
            "TRAINRUN_CROSS_RANK", "TRAINRUN_CROSS_SIZE", "TRAINRUN_HOSTNAME", "TRAINRUN_JOB_ID")


def ranks(run) -> dict[int, dict]:
    """{rank: env_dump record} from a --prefix none run of env_dump.py."""
    assert run.rc == 0, run.stderr
    recs = run.json_lines()
    by_rank = {int(r["env"]["RANK"]): r for r in recs}
    assert len(by_rank) == len(recs), "two processes claimed the same RANK"
    return by_rank


def test_env_contract_one_host(run_trainrun):
    got = ranks(run_trainrun("-np", 3, "--prefix", "none", worker("env_dump.py")))
    assert sorted(got) == [0, 1, 2]
    envs = [got[r]["env"] for r in range(3)]
    for r, env in enumerate(envs):
        missing = [k for k in CONTRACT if k not in env]
        assert not missing, f"rank {r} lacks {missing}"
        assert (env["RANK"], env["WORLD_SIZE"]) == (str(r), "3")
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(r), "3")
        assert (env["NODE_RANK"], env["NNODES"]) == ("0", "1")
        assert (env["TRAINRUN_RANK"], env["TRAINRUN_SIZE"]) == (str(r), "3")
        assert (env["TRAINRUN_LOCAL_RANK"], env["TRAINRUN_LOCAL_SIZE"]) == (str(r), "3")
        assert (env["TRAINRUN_CROSS_RANK"], env["TRAINRUN_CROSS_SIZE"]) == ("0", "1")
        assert env["TRAINRUN_HOSTNAME"] == "localhost"
    # job-wide values: the same for every rank, and usable
    for key in ("MASTER_ADDR", "MASTER_PORT", "TRAINRUN_JOB_ID"):
        assert len({env[key] for env in envs}) == 1, key
    assert envs[0]["MASTER_ADDR"] == "127.0.0.1"
    assert 1024 <= int(envs[0]["MASTER_PORT"]) < 65536
    assert envs[0]["TRAINRUN_JOB_ID"]
    # each rank is its own process
    assert len({got[r]["pid"] for r in got}) == 3


def test_job_id_differs_between_jobs(run_trainrun):
    a = ranks(run_trainrun("-np", 1, "--prefix", "none", worker("env_dump.py")))
    b = ranks(run_trainrun("-np", 1, "--prefix", "none", worker("env_dump.py")))
    assert a[0]["env"]["TRAINRUN_JOB_ID"] != b[0]["env"]["TRAINRUN_JOB_ID"]


def test_two_local_names_make_two_nodes(run_trainrun):
    got = ranks(run_trainrun("-H", "localhost:2,127.0.0.1:2", "--prefix", "none", worker("env_dump.py")))
    assert sorted(got) == [0, 1, 2, 3]
    want = {  # rank: (LOCAL_RANK, NODE_RANK, CROSS_RANK, HOSTNAME)
        0: ("0", "0", "0", "localhost"),
        1: ("1", "0", "0", "localhost"),
        2: ("0", "1", "1", "127.0.0.1"),
        3: ("1", "1", "1", "127.0.0.1"),
    }
    for r, (local, node, cross, host) in want.items():
        env = got[r]["env"]
        assert env["WORLD_SIZE"] == env["TRAINRUN_SIZE"] == "4"
        assert env["LOCAL_RANK"] == env["TRAINRUN_LOCAL_RANK"] == local
        assert env["LOCAL_WORLD_SIZE"] == env["TRAINRUN_LOCAL_SIZE"] == "2"
        assert (env["NODE_RANK"], env["NNODES"]) == (node, "2")
        assert (env["TRAINRUN_CROSS_RANK"], env["TRAINRUN_CROSS_SIZE"]) == (cross, "2")
        assert env["TRAINRUN_HOSTNAME"] == host
    assert len({got[r]["env"]["MASTER_PORT"] for r in got}) == 1


def test_np_fills_hosts_in_order(run_trainrun):
    got = ranks(run_trainrun("-np", 3, "-H", "localhost:2,127.0.0.1:2", "--prefix", "none", worker("env_dump.py")))
    assert [got[r]["env"]["TRAINRUN_HOSTNAME"] for r in range(3)] == ["localhost", "localhost", "127.0.0.1"]
    assert got[2]["env"]["LOCAL_WORLD_SIZE"] == "1"
    assert got[0]["env"]["NNODES"] == "2"


def test_py_program_runs_with_launcher_interpreter(run_trainrun, tmp_path):
    # the worker is not executable and has no shebang line: only `sys.executable worker.py` can run it
    script = tmp_path / "prog.py"
    script.write_text("import sys\nprint('interp', sys.executable)\n")
    run = run_trainrun("-np", 1, "--prefix", "none", "prog.py")
    assert run.rc == 0, run.stderr
    assert run.stdout.split() == ["interp", sys.executable]


ARGS = ["-np", "7", "-H", "elsewhere:9", "--help", "--version", "a b", "it's", '"quoted"', "", "--", "-x", "Y=1",
        "$HOME", "*", "ünï"]


def test_args_after_program_passed_untouched(run_trainrun):
    got = ranks(run_trainrun("-np", 2, "--prefix", "none", worker("env_dump.py"), *ARGS))
    assert sorted(got) == [0, 1], "a -np after the program must not change the launcher's -np"
    for r in got.values():
        assert r["argv"] == ARGS


def test_args_after_non_python_program_untouched(run_trainrun):
    code = "import json, sys; print(json.dumps({'argv': sys.argv[1:], 'env': {'RANK': '0'}}))"
    run = run_trainrun("-np", 1, "--prefix", "none", sys.executable, "-c", code, *ARGS)
    assert ranks(run)[0]["argv"] == ARGS


def test_double_dash_before_program(run_trainrun):
    """`--` ends the launcher's options; a later `--` belongs to the program."""
    run = run_trainrun("-np", 1, "--prefix", "none", "--", worker("env_dump.py"), "--", "-np", "3")
    assert ranks(run)[0]["argv"] == ["--", "-np", "3"]


def test_export_name_value_and_name(run_trainrun):
    env = base_env(FROM_LAUNCHER="launcher value", NOT_EXPORTED_EXPLICITLY="x")
    run = run_trainrun("-np", 2, "--prefix", "none", "-x", "FOO=bar baz", "-x", "EMPTY=", "-x", "EQ=a=b",
                       "-x", "FROM_LAUNCHER", "--export", "LONG=1", worker("env_dump.py"), env=env)
    for r in ranks(run).values():
        e = r["env"]
        assert e["FOO"] == "bar baz"
        assert e["EMPTY"] == ""
        assert e["EQ"] == "a=b"
        assert e["FROM_LAUNCHER"] == "launcher value"
        assert e["LONG"] == "1"


def test_export_overrides_launcher_environment(run_trainrun):
    run = run_trainrun("-np", 1, "--prefix", "none", "-x", "SOME_VAR=new", worker("env_dump.py"),
                       env=base_env(SOME_VAR="old"))
    assert ranks(run)[0]["env"]["SOME_VAR"] == "new"


def test_launcher_environment_is_inherited(run_trainrun):
    run = run_trainrun("-np", 1, "--prefix", "none", worker("env_dump.py"), env=base_env(INHERITED_VAR="yes"))
    assert ranks(run)[0]["env"]["INHERITED_VAR"] == "yes"


@pytest.mark.parametrize("np_", [1, 2, 4])
def test_omp_num_threads_default(run_trainrun, np_):
    cpus = len(os.sched_getaffinity(0))
    run = run_trainrun("-np", np_, "--prefix", "none", worker("env_dump.py"), env=base_env(OMP_NUM_THREADS=None))
    got = ranks(run)
    assert len(got) == np_
    for r in got.values():
        assert r["env"]["OMP_NUM_THREADS"] == str(max(1, cpus // np_))


def test_omp_num_threads_kept_when_set(run_trainrun):
    run = run_trainrun("-np", 2, "--prefix", "none", worker("env_dump.py"), env=base_env(OMP_NUM_THREADS="7"))
    assert {r["env"]["OMP_NUM_THREADS"] for r in ranks(run).values()} == {"7"}


def test_omp_num_threads_from_export(run_trainrun):
    run = run_trainrun("-np", 2, "--prefix", "none", "-x", "OMP_NUM_THREADS=5", worker("env_dump.py"),
                       env=base_env(OMP_NUM_THREADS=None))
    assert {r["env"]["OMP_NUM_THREADS"] for r in ranks(run).values()} == {"5"}


def test_torch_huge_pages_default_and_opt_out(run_trainrun):
    """THP_MEM_ALLOC_ENABLE=1 (torch's allocator asks for huge pages on large tensors) unless the user set it."""
    run = run_trainrun("-np", 2, "--prefix", "none", worker("env_dump.py"), env=base_env(THP_MEM_ALLOC_ENABLE=None))
    assert {r["env"]["THP_MEM_ALLOC_ENABLE"] for r in ranks(run).values()} == {"1"}
    run = run_trainrun("-np", 2, "--prefix", "none", worker("env_dump.py"), env=base_env(THP_MEM_ALLOC_ENABLE="0"))
    assert {r["env"]["THP_MEM_ALLOC_ENABLE"] for r in ranks(run).values()} == {"0"}


def _core_sets() -> list[set[int]]:
    cores: dict[str, set[int]] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        p = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        key = p.read_text().strip() if p.exists() else str(cpu)
        cores.setdefault(key, set()).add(cpu)
    return list(cores.values())


def test_bind_to_core(run_trainrun):
    cores = _core_sets()
    np_ = min(2, len(cores))
    got = ranks(run_trainrun("-np", np_, "--bind-to", "core", "--prefix", "none", worker("env_dump.py")))
    seen = []
    for r in range(np_):
        aff = set(got[r]["affinity"])
        assert aff in cores, f"rank {r} affinity {sorted(aff)} is not one core's CPUs {cores}"
        seen.append(aff)
    assert len({frozenset(s) for s in seen}) == np_, "local ranks must get different cores"


def test_bind_to_none_keeps_all_cpus(run_trainrun):
    got = ranks(run_trainrun("-np", 1, "--prefix", "none", worker("env_dump.py")))
    assert set(got[0]["affinity"]) == os.sched_getaffinity(0)


def test_example_env_contract(run_trainrun):
    """The contract example of the guide's getting started (docs/getting-started.md; tests/docs runs the block too)."""
    repo = Path(__file__).resolve().parents[2]
    run = run_trainrun("-np", 2, "examples/env_contract.py", cwd=repo)
    assert run.rc == 0, run.stderr
    lines = run.stdout.splitlines()
    for r in (0, 1):
        mine = [line.split(":", 1)[1] for line in lines if line.startswith(f"[{r}]<stdout>:")]
        values = dict((k.strip(), v.strip()) for k, v in (m.split("=", 1) for m in mine))
        assert values["RANK"] == values["TRAINRUN_RANK"] == str(r)
        assert values["WORLD_SIZE"] == "2" and values["NNODES"] == "1"


STRAY_PMI = {"PMI_FD": "99", "PMI_RANK": "5", "PMI_SIZE": "8", "PMI_PORT": "elsewhere:1234"}  # an outer launcher's


def test_pmi_contract_with_mpi_world(run_trainrun):
    """Default (MPI world on): PMI_RANK/PMI_SIZE match RANK/WORLD_SIZE and PMI_FD is an open socket;
    an outer launcher's PMI_* are not passed on."""
    run = run_trainrun("-np", 2, "--prefix", "none", worker("env_dump.py"), env=base_env(**STRAY_PMI))
    for r, rec in ranks(run).items():
        env = rec["env"]
        assert (env["PMI_RANK"], env["PMI_SIZE"]) == (str(r), "2")
        assert rec["pmi_fd"] == "socket"
        assert "PMI_PORT" not in env


def test_no_pmi_without_mpi_world(run_trainrun):
    """--mpi none: no PMI_* at all, not even an outer launcher's (MPI_Init would follow a stray PMI_FD)."""
    run = run_trainrun("-np", 2, "--mpi", "none", "--prefix", "none", worker("env_dump.py"), env=base_env(**STRAY_PMI))
    for rec in ranks(run).values():
        assert sorted(k for k in rec["env"] if k.startswith("PMI_")) == []
