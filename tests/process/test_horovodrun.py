"""`horovodrun` launches for real (the console script's main, in a child process): the tutorial's first
command line at small scale, Horovod's `[1,0]<stdout>:` output, notes, refusals, --check-build, the
HOROVOD_* variables reaching the ranks, --output-filename, a failing rank's exit code, a discovery script
with --slots-per-host. Every option's translation is in tests/unit/test_horovodrun_translate.py."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

TRAIN = """
import os, numpy as np
import trainrun.numpy as hvd
hvd.init()
total = hvd.allreduce(np.array([float(hvd.rank())]), op=hvd.Sum)
print("rank", hvd.rank(), "of", hvd.size(), "sum", int(total[0]), "fusion", os.environ.get("HOROVOD_FUSION_THRESHOLD"),
      "ucx", os.environ.get("UCX_TLS"))
"""


def horovodrun(*args, cwd, timeout=90, env=None):
    """Run horovodrun with this interpreter's bin folder first on PATH, so `python` is the one with trainrun."""
    env = dict(env or os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "trainrun.horovodrun", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"horovodrun {args} did not end in {timeout}s: {err}")
    return proc.returncode, out, err


@pytest.fixture
def train(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path


def test_tutorial_shape_with_open_mpi_prefix(train):
    """`horovodrun -np 16 -H server1:4,...` at small scale: -np 4 over two 2-slot "hosts" of this machine."""
    rc, out, err = horovodrun("-np", "4", "-H", "localhost:2,127.0.0.1:2", "python", "train.py", cwd=train)
    assert rc == 0, err
    for r in range(4):
        assert f"[1,{r}]<stdout>:rank {r} of 4 sum 6" in out
    assert err == ""  # nothing noted: every option did its job


def test_bare_mpi_flag_and_tuning_variables_reach_the_ranks(train):
    """The issue's first failing line (`horovodrun --mpi -np 2 python train.py`), with a tuning option."""
    rc, out, err = horovodrun("--mpi", "-np", "2", "--fusion-threshold-mb", "1", "--tcp", "python", "train.py", cwd=train)
    assert rc == 0, err
    assert "[1,1]<stdout>:rank 1 of 2 sum 1 fusion 1048576 ucx tcp,sm,self" in out


def test_noted_option_says_one_line_and_runs(train):
    rc, out, err = horovodrun("-np", "2", "--hierarchical-allreduce", "--gloo", "python", "train.py", cwd=train)
    assert rc == 0, err
    notes = [line for line in err.splitlines() if line.startswith("horovodrun: ")]
    assert len(notes) == 2 and any("--hierarchical-allreduce has no effect" in n for n in notes)
    assert "[1]<stdout>:rank 1 of 2" in out  # --gloo: Horovod's Gloo prefix


def test_timestamp_prefix(train):
    rc, out, _ = horovodrun("-np", "1", "--prefix-output-with-timestamp", "python", "train.py", cwd=train)
    assert rc == 0 and re.search(r"^\d\d:\d\d:\d\d\.\d{3} \[1,0\]<stdout>:rank 0", out, re.M), out


def test_refused_option_is_one_line_exit_2(train):
    rc, out, err = horovodrun("--jsrun", "-np", "2", "python", "train.py", cwd=train)
    assert rc == 2 and out == ""
    assert err.splitlines() == [err.strip()] and err.startswith("horovodrun: error: --jsrun: ")


def test_parse_error_is_one_line_exit_2(train):
    rc, _, err = horovodrun("-np", "two", "python", "train.py", cwd=train)
    assert rc == 2 and err.strip() == ("horovodrun: error: argument -np/--num-proc: invalid int value: 'two' "
                                       "(see horovodrun --help)")


def test_check_build_and_version(train):
    rc, out, _ = horovodrun("--check-build", cwd=train)
    assert rc == 0 and out.startswith("Horovod v0.28.1 (trainrun ") and "    [X] MPI" in out and "    [ ] Gloo" in out
    rc, out, _ = horovodrun("--version", cwd=train)
    assert rc == 0 and out.startswith("0.28.1 (trainrun ")


FAIL_AFTER_RANK_0_PRINTED = """\
import os, sys, time
if os.environ['RANK'] == '0':
    print('out 0', flush=True)
    open('printed', 'w').close()
    time.sleep(60)  # stopped by fail-fast: its printed line must still reach its file
else:
    deadline = time.time() + 30
    while not os.path.exists('printed') and time.time() < deadline:
        time.sleep(0.02)
    sys.exit(3)
"""


def test_output_filename_and_failing_rank(train):
    """Rank 1 fails only once rank 0 has printed (else fail-fast may stop rank 0 before its print: a race, not a
    loss); rank 0, stopped by fail-fast, keeps what it printed in its file."""
    (train / "fail.py").write_text(FAIL_AFTER_RANK_0_PRINTED)
    rc, _, err = horovodrun("-np", "2", "--output-filename", "logs", "python", "fail.py", cwd=train)
    assert rc == 3 and "rank 1" in err
    assert (train / "logs" / "rank.0" / "stdout").read_text() == "out 0\n"


def test_config_file_sets_the_ranks_variables(train):
    (train / "hvd.yaml").write_text("params:\n  fusion_threshold_mb: 2\n")
    rc, out, err = horovodrun("-np", "1", "--config-file", "hvd.yaml", "python", "train.py", cwd=train)
    assert rc == 0 and "fusion 2097152" in out, err


def test_discovery_script_with_slots_per_host(train):
    """Elastic: the script prints a bare host; --slots-per-host gives it 2 slots (else 1), -np 2 fits."""
    script = train / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost\n")
    script.chmod(0o755)
    rc, out, err = horovodrun("-np", "2", "--host-discovery-script", str(script), "--slots-per-host", "2",
                              "python", "train.py", cwd=train)
    assert rc == 0, err
    assert "[1,1]<stdout>:rank 1 of 2 sum 1" in out


PROGRAMS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "horovod_compat", "programs")
needs_tf = pytest.mark.skipif(__import__("importlib").util.find_spec("tensorflow") is None, reason="TensorFlow not installed")


def trained_alike(out: str) -> list[dict]:
    """The two ranks' REPORT lines (programs/report.py), as horovodrun prints them ([1,N]<stdout>:REPORT {...})."""
    import json

    rows = sorted((json.loads(line.split("REPORT ", 1)[1]) for line in out.splitlines()
                   if re.match(r"\[1,\d\]<stdout>:REPORT ", line)), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1], out[-3000:]
    assert rows[0]["weights"] == rows[1]["weights"] and rows[0]["losses"][-1] < rows[0]["losses"][0], rows
    assert all(r["horovod"].endswith(os.path.join("_horovod", "horovod", "__init__.py")) for r in rows)
    return rows


@pytest.mark.parametrize("program,options", [
    ("pytorch_synthetic_benchmark.py", ["-np", "2"]),
    ("pytorch_synthetic_benchmark_elastic.py", ["-np", "2", "--min-np", "2", "--max-np", "2", "-H", "localhost:2"]),
    pytest.param("tensorflow2_synthetic_benchmark.py", ["-np", "2"], marks=[pytest.mark.slow, needs_tf]),
    pytest.param("tensorflow2_keras_synthetic_benchmark.py", ["-np", "2"], marks=[pytest.mark.slow, needs_tf]),
])
@pytest.mark.timeout(300)
def test_horovod_example_programs_unchanged(tmp_path, program, options):
    """Programs in the shape of Horovod 0.28.1's examples (tests/horovod_compat/programs: `import horovod.torch
    as hvd`, ...), launched by a horovodrun command line as Horovod's docs write it."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow", TRAINRUN_STALL_TIMEOUT="60")
    rc, out, err = horovodrun(*options, "python", os.path.join(PROGRAMS, program), "--no-cuda", cwd=tmp_path,
                              timeout=280, env=env)
    assert rc == 0, err[-3000:]
    trained_alike(out)
