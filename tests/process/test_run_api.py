"""trainrun.run / horovod.run: a function on N ranks through a real launch (real processes, the MPI world),
its values back in rank order; a raising rank as RankError (rank, host, traceback); a function of a
script's __main__; from a real Jupyter kernel; elastic attempts; the payload's two ways."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import trainrun
from trainrun.errors import UsageError
from trainrun.runfunc import horovod as hvd_run
from trainrun.wire.runfunc_lines import MAX_ENV_BYTES

pytestmark = pytest.mark.timeout(180)


def rank_and_sum(scale):
    """Each rank: its rank, and the allreduced sum of ranks (the MPI world is really formed)."""
    import numpy as np

    import trainrun.numpy as hvd

    hvd.init()
    total = hvd.allreduce(np.array([float(hvd.rank())]), op=hvd.Sum)
    return hvd.rank() * scale, float(total[0]), hvd.size()


def test_values_in_rank_order_from_three_ranks(capfd):
    assert trainrun.run(rank_and_sum, (10,), np=3) == [(0, 3.0, 3), (10, 3.0, 3), (20, 3.0, 3)]


def say_and_return(tag):
    print("hello", tag, os.environ["RANK"], flush=True)
    print("partial line without newline", end="")
    return {"rank": int(os.environ["RANK"]), "tag": tag}


def test_output_passes_through_and_outcome_lines_do_not(capsys):
    values = trainrun.run(say_and_return, kwargs={"tag": "t"}, np=2)
    assert values == [{"rank": 0, "tag": "t"}, {"rank": 1, "tag": "t"}]
    out = capsys.readouterr().out
    assert "[0]<stdout>:hello t 0" in out and "[1]<stdout>:hello t 1" in out
    assert "[1]<stdout>:partial line without newline" in out  # the rank's partial line, ended by the outcome line
    assert "trainrun-result" not in out


def fail_on_rank_one(pid_dir):
    import numpy as np

    import trainrun.numpy as hvd

    hvd.init()
    with open(os.path.join(pid_dir, f"pid.{hvd.rank()}"), "w") as f:
        f.write(str(os.getpid()))
    hvd.allreduce(np.ones(1))
    if hvd.rank() == 1:
        raise KeyError("no such shard")
    hvd.allreduce(np.ones(1))  # rank 0 waits here for rank 1: fail-fast must end it
    return "unreachable"


def test_raising_rank_is_raised_with_rank_host_and_traceback(tmp_path):
    from launch_helpers import wait_gone

    with pytest.raises(trainrun.RankError) as info:
        trainrun.run(fail_on_rank_one, (str(tmp_path),), np=2)
    err = info.value
    assert (err.rank, err.host) == (1, "localhost")
    assert isinstance(err.exception, KeyError)
    assert 'raise KeyError("no such shard")' in err.traceback and "in fail_on_rank_one" in err.traceback
    assert str(err).startswith("rank 1 on localhost raised KeyError: 'no such shard'")
    pids = [int((tmp_path / f"pid.{r}").read_text()) for r in (0, 1)]
    assert wait_gone(pids, 10) == []  # no rank left behind (rank 0 was stopped inside its allreduce)


def exit_hard():
    if os.environ["RANK"] == "1":
        os._exit(7)
    return 0


def test_rank_that_dies_without_an_outcome_is_a_run_error():
    with pytest.raises(trainrun.RunError, match=r"exit code 7 before every rank returned") as info:
        trainrun.run(exit_hard, np=2)
    assert info.value.exit_code == 7


def test_bad_option_is_a_usage_error_before_anything_starts():
    with pytest.raises(UsageError, match="--min-np 3 is more than -np 2"):
        trainrun.run(say_and_return, ("x",), np=2, min_np=3)
    with pytest.raises(UsageError, match="unknown option 'colour'"):
        trainrun.run(say_and_return, ("x",), np=2, colour="red")
    with pytest.raises(UsageError, match="prefix cannot be given"):
        trainrun.run(say_and_return, ("x",), np=2, prefix="none")


def fail_first_attempt():
    if os.environ["RANK"] == "1" and os.environ.get("TRAINRUN_RESTART_COUNT") == "0":
        raise RuntimeError("first attempt fails")
    return int(os.environ["TRAINRUN_RESTART_COUNT"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def test_elastic_restart_returns_the_last_attempts_values():
    assert trainrun.run(fail_first_attempt, np=2, max_restarts=1) == [(1, 0, 2), (1, 1, 2)]


def elastic_view():
    return os.environ.get("TRAINRUN_ELASTIC"), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def test_elastic_sizes_through_horovod_run():
    """horovod.run's min_num_proc/max_num_proc: an elastic job (trainrun's elastic loop) over the hosts given."""
    values = hvd_run.run(elastic_view, num_proc=2, min_num_proc=1, max_num_proc=2, hosts="localhost:2")
    assert values == [("1", 0, 2), ("1", 1, 2)]


def test_horovod_run_over_hosts_carries_the_call_in_the_environment():
    """hosts=...: the payload takes the environment way (what reaches remote hosts)."""
    assert hvd_run.run(rank_and_sum, args=(1,), num_proc=2, hosts="localhost:1,127.0.0.1:1") == [(0, 1.0, 2), (1, 1.0, 2)]


def length(blob):
    return len(blob)


def test_big_call_goes_through_a_private_file_locally_and_is_refused_for_hosts():
    big = os.urandom(MAX_ENV_BYTES)  # over the environment's limit once base64-encoded
    assert trainrun.run(length, (big,), np=2) == [len(big)] * 2
    with pytest.raises(UsageError, match="KiB reach remote hosts"):
        trainrun.run(length, (big,), np=2, hosts="localhost:2")


SCRIPT = '''
import json, os, sys
import trainrun

OFFSET = 100

def helper(r):
    return r + OFFSET

def work(n):
    return [helper(int(os.environ["RANK"]))] * n

if __name__ == "__main__":
    print("VALUES", json.dumps(trainrun.run(work, (2,), np=2)))
    try:
        trainrun.run(lambda: 1 / 0, np=2)
    except trainrun.RankError as err:
        print("ERROR", json.dumps({"rank": err.rank, "tb": err.traceback}))
'''


def test_function_of_a_scripts_main(tmp_path):
    """Functions (and a lambda, and the globals they use) defined in the script run as `python script.py`."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if line.startswith(("VALUES", "ERROR")))
    assert json.loads(lines["VALUES"]) == [[100, 100], [101, 101]]
    err = json.loads(lines["ERROR"])
    assert err["rank"] in (0, 1) and "ZeroDivisionError" in err["tb"]  # both raise: the first to report is named
    assert f'File "{script}", line 16, in <lambda>' in err["tb"] and "trainrun.run(lambda: 1 / 0, np=2)" in err["tb"]


CELL = textwrap.dedent('''
    import os, trainrun
    def cell_function(x):
        print("hello from rank", os.environ["RANK"])
        return x * int(os.environ["RANK"])
    print("RESULT", trainrun.run(cell_function, (10,), np=2))
''')
FAILING_CELL = textwrap.dedent('''
    def broken():
        raise ValueError("from the notebook")
    trainrun.run(broken, np=2)
''')


def test_from_a_jupyter_kernel(tmp_path):
    """A real kernel (jupyter_client + ipykernel): a function defined in a cell runs on 2 ranks; the ranks'
    output reaches the cell; a raising rank is the cell's error, with the cell's source line."""
    client = pytest.importorskip("jupyter_client.manager", reason="jupyter_client not installed (pip install -e '.[test]')")
    km, kc = client.start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        out, errors = [], []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                errors.append(msg["content"])

        kc.execute_interactive(CELL, timeout=120, output_hook=hook)
        text = "".join(out)
        assert "RESULT [0, 10]" in text and "[1]<stdout>:hello from rank 1" in text and not errors, (text, errors)
        kc.execute_interactive(FAILING_CELL, timeout=120, output_hook=hook)
        assert [e["ename"] for e in errors] == ["RankError"]
        assert "raised ValueError: from the notebook" in errors[0]["evalue"]
        assert 'raise ValueError("from the notebook")' in errors[0]["evalue"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


HOROVOD_SCRIPT = '''
import json, os, sys
sys.path.insert(0, sys.argv[1])  # trainrun's horovod shim, as a Horovod user would have `horovod` importable
import horovod
from horovod.runner import run

def fn(base):
    return base + int(os.environ["RANK"])

assert run is horovod.run
print("VALUES", json.dumps(horovod.run(fn, args=(5,), num_proc=2)))
'''


def test_horovod_run_through_the_shim_from_a_script(tmp_path):
    """`import horovod; horovod.run(...)` (and horovod.runner.run) outside a launch, with the shim importable."""
    from trainrun.plan.horovod_shim import SHIM_DIR

    script = tmp_path / "hvd_script.py"
    script.write_text(HOROVOD_SCRIPT)
    r = subprocess.run([sys.executable, str(script), SHIM_DIR], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "VALUES [5, 6]" in r.stdout


def test_trainrun_run_is_the_function_after_the_launchers_modules_are_imported():
    """`trainrun.run` is a function of the package, not a subpackage's name (the launcher's supervision
    lives in trainrun/supervisor/): importing the launcher's modules must leave it a function that runs."""
    import trainrun.supervisor.output  # noqa: F401

    assert callable(trainrun.run) and not hasattr(trainrun.run, "__path__")
    assert trainrun.run(length, (b"abc",), np=1) == [3]


SLEEPER_SCRIPT = '''
import os, sys, time
import trainrun

def sleeper(folder):
    with open(os.path.join(folder, "pid." + os.environ["RANK"]), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)

try:
    trainrun.run(sleeper, (sys.argv[1],), np=2)
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
'''


def _start_sleepers(tmp_path):
    import time

    script = tmp_path / "sleepers.py"
    script.write_text(SLEEPER_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("pid.*"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    return proc, [int(p.read_text()) for p in sorted(tmp_path.glob("pid.*"))]


@pytest.mark.parametrize("how", ["ctrl-c", "caller killed"])
def test_no_rank_outlives_an_interrupted_or_killed_caller(tmp_path, how):
    """Ctrl-C in the caller (a notebook's interrupt): the job is stopped and KeyboardInterrupt raised. The caller
    SIGKILLed: the launcher gets SIGTERM (PR_SET_PDEATHSIG) and tears the job down. No rank is left either way."""
    import signal as sig

    from launch_helpers import assert_all_gone

    proc, pids = _start_sleepers(tmp_path)
    try:
        proc.send_signal(sig.SIGINT if how == "ctrl-c" else sig.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        if how == "ctrl-c":
            assert "INTERRUPTED" in out
        assert_all_gone(pids, timeout=20, what="ranks of trainrun.run")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, sig.SIGKILL)
            proc.communicate()


def seeded_bytes(n):
    import random

    return random.Random(int(os.environ["RANK"])).randbytes(n)


# the peak from VmHWM: ru_maxrss would carry over the forking pytest's own RSS (Linux keeps it across exec)
BIG_CALLER = '''
import re, sys, trainrun
sys.path.insert(0, sys.argv[1])
from test_run_api import seeded_bytes
values = trainrun.run(seeded_bytes, (50 << 20,), np=2)
peak = int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read())[1]) >> 10
print("PEAK_MB", peak, "LENS", *map(len, values))
'''


def test_a_50_mb_value_per_rank_round_trips_exactly_in_about_one_copy(tmp_path):
    """Ranks on this machine stream their values through the call's socket: the caller holds the values
    (2 x 50 MB) and little more; as base64 output lines (before) it peaked at ~270 MB."""
    import random

    values = trainrun.run(seeded_bytes, (50 << 20,), np=2)
    assert values == [random.Random(r).randbytes(50 << 20) for r in (0, 1)]
    del values
    r = subprocess.run([sys.executable, "-c", BIG_CALLER, os.path.dirname(__file__)], capture_output=True, text=True,
                       timeout=150, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    words = r.stdout.split()
    peak = int(words[words.index("PEAK_MB") + 1])
    assert words[-2:] == [str(50 << 20)] * 2 and peak < 100 + 70, r.stdout


def test_a_value_over_the_lines_limit_from_another_host_is_one_clear_error(monkeypatch):
    """A rank that cannot reach the caller's socket (as on another host: -x TRAINRUN_RUN_SOCKET= stands for a
    path not there) sends its value as lines, up to TRAINRUN_RUN_REMOTE_RESULT_MB; above it the caller
    gets ResultTooLarge naming the rank, the size, the limit and what to do."""
    monkeypatch.setenv("TRAINRUN_RUN_REMOTE_RESULT_MB", "0.5")
    elsewhere = {"TRAINRUN_RUN_SOCKET": ""}
    import random

    assert trainrun.run(seeded_bytes, (200_000,), np=2, env=elsewhere) == [random.Random(r).randbytes(200_000) for r in (0, 1)]
    with pytest.raises(trainrun.RunError) as info:
        trainrun.run(seeded_bytes, (1 << 20,), np=2, env=elsewhere)
    text = str(info.value)
    assert type(info.value).__name__ == "ResultTooLarge" and "\n" not in text
    assert text.startswith("rank 0 on localhost returned 1.0 MiB (pickled), more than the 0.5 MiB"), text
    assert "TRAINRUN_RUN_REMOTE_RESULT_MB" in text and "write big results to a file" in text


TERMINAL_SCRIPT = '''
import sys, trainrun

def noisy():
    sys.stdout.buffer.write(b"\\x1b[2J\\x1b]0;title\\x07\\x1b[31mred\\x1b[0m\\n")
    sys.stdout.flush()
    return 7

print("VALUES", trainrun.run(noisy, np=1))
'''


def test_trainrun_run_on_a_terminal_shows_the_ranks_controls_as_text(tmp_path):
    """The launcher writes to the caller's pipes; the caller, whose stdout is a terminal, escapes the
    rank's screen clear and title and keeps its colour."""
    from test_launch_output import _under_a_terminal

    script = tmp_path / "noisy.py"
    script.write_text(TERMINAL_SCRIPT)
    code, screen = _under_a_terminal([sys.executable, str(script)], tmp_path, timeout=90)
    assert code == 0 and b"VALUES [7]" in screen, screen
    assert b"[0]<stdout>:\\x1b[2J\\x1b]0;title\\x07\x1b[31mred\x1b[0m" in screen, screen
    assert b"\x1b[2J" not in screen and b"\x1b]0;" not in screen, screen
