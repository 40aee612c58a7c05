"""Mismatches fail on every rank naming the tensor and the difference; stalls name the missing rank."""
import json
import subprocess
import sys

import pytest

from tests.runtime.launch import WORKERS, check, run_cases, run_ranks

CASES = ["shape_mismatch", "dtype_op_root_kind_mismatch", "mismatch_after_the_signature_was_cached",
         "still_works_after_errors",
         "stall_names_missing_rank_and_tensor", "stall_of_a_cached_op_names_missing_rank", "duplicate_name_in_flight"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_cases("errors", 2, tmp_path_factory.mktemp("errors"), env={"TRAINRUN_STALL_TIMEOUT": "1"})


@pytest.mark.parametrize("case", CASES)
def test_case(results, case):
    check(results, case)


def test_single_process_init_shutdown_timeline(tmp_path):
    """No launcher at all: size 1; also init after shutdown and the timeline file."""
    proc = subprocess.run([sys.executable, str(WORKERS / "single.py"), str(tmp_path / "tl.json")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "single ok" in proc.stdout, proc.stderr[-3000:]


def test_timeline_has_every_rank(tmp_path):
    path = tmp_path / "timeline.json"
    code = ("import numpy as np, trainrun.runtime as hvd; hvd.init(); "
            "[hvd.allreduce(np.ones(100), name=f'g{i}') for i in range(3)]; "
            "[hvd.allreduce(np.ones(100), name='g0') for i in range(2)]; hvd.shutdown()")  # then cached
    script = tmp_path / "tl.py"
    script.write_text(code)
    proc = run_ranks(script, 2, env={"TRAINRUN_TIMELINE": str(path)}, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = json.loads(path.read_text())["traceEvents"]
    spans = [(e["pid"], e["name"]) for e in events if e["ph"] == "X"]
    for rank in (0, 1):  # every op, negotiated or agreed through the response cache, has its spans
        assert spans.count((rank, "ALLREDUCE")) == 5, spans
        assert spans.count((rank, "NEGOTIATE")) == 6, spans  # and the collective shutdown


def test_env_contract_disagreement_is_an_error(tmp_path):
    """A TRAINRUN_* contract that disagrees with the MPI world (set by hand, under mpiexec, since the
    trainrun launcher sets a right one) stops init naming each wrong variable."""
    script = tmp_path / "env.py"
    script.write_text("import trainrun.runtime as hvd; hvd.init()")
    contract = {"TRAINRUN_RANK": "0", "TRAINRUN_SIZE": "3", "TRAINRUN_LOCAL_RANK": "5", "TRAINRUN_LOCAL_SIZE": "2",
                "TRAINRUN_CROSS_RANK": "0", "TRAINRUN_CROSS_SIZE": "1"}
    proc = run_ranks(script, 2, env=contract, timeout=60, using="mpiexec")
    assert proc.returncode != 0
    assert "TRAINRUN_SIZE=3 but MPI says 2" in proc.stderr and "TRAINRUN_LOCAL_RANK=5" in proc.stderr
    assert "TRAINRUN_CROSS_SIZE" not in proc.stderr  # only the wrong ones are named


def test_incomplete_env_contract_is_an_error(tmp_path):
    script = tmp_path / "env.py"
    script.write_text("import trainrun.runtime as hvd; hvd.init()")
    proc = run_ranks(script, 2, env={"TRAINRUN_RANK": "0"}, timeout=60, using="mpiexec")
    assert proc.returncode != 0 and "environment contract is incomplete" in proc.stderr, proc.stderr[-2000:]


def test_a_crashing_rank_fails_the_others_fast(tmp_path):
    """A rank dies with an exception: the others' pending collective fails at once, naming it."""
    script = tmp_path / "crash.py"
    script.write_text(
        "import time, numpy as np, trainrun.runtime as hvd\n"
        "hvd.init()\n"
        "if hvd.rank() == 1:\n"
        "    time.sleep(0.3)\n"
        "    raise SystemError('boom')\n"
        "t = time.monotonic()\n"
        "try:\n"
        "    hvd.allreduce(np.ones(3), name='never')\n"
        "except hvd.HorovodInternalError as e:\n"
        "    print('CAUGHT', round(time.monotonic() - t, 1), e, flush=True)\n")
    proc = run_ranks(script, 2, env={"TRAINRUN_STALL_TIMEOUT": "60"}, timeout=60)
    assert "CAUGHT" in proc.stdout and "rank 1 stopped" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    waited = float(proc.stdout.split("CAUGHT")[1].split()[0])
    assert waited < 5, proc.stdout


def test_a_failure_inside_a_collective_ends_the_job(tmp_path):
    """An exception while a collective runs (here planted in the CPU reduction; on a GPU, NCCL refusing two
    ranks on one device) fails the waiting call on every rank with its message, instead of leaving the
    request in no queue and its caller waiting forever."""
    script = tmp_path / "broken.py"
    script.write_text(
        "import numpy as np, trainrun.numpy as hvd\n"
        "from trainrun.runtime import lifecycle\n"
        "hvd.init()\n"
        "def boom(*a, **k):\n"
        "    raise RuntimeError('planted failure in a collective')\n"
        "host = lifecycle.engine()._dispatch.host\n"
        "host.allreduce_one = host.allreduce = boom\n"
        "try:\n"
        "    hvd.allreduce(np.ones(4), name='x')\n"
        "except hvd.HorovodInternalError as e:\n"
        "    print('RAISED', e)\n")
    proc = run_ranks(script, 2, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("RAISED trainrun engine failed: RuntimeError: planted failure in a collective") == 2, proc.stdout
