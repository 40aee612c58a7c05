"""In-flight diagnosis on this machine: stacks on SIGUSR1 and --hang-timeout (py-spy and the faulthandler
fallback), a StallError asking for them, the first failure by time, --fold / --ranks, and no escaped
orphans (setsid grandchildren) after fail-fast, Ctrl-C and a SIGKILLed launcher."""
import os
import re
import signal
import sys
import threading
import time

import pytest
from launch_helpers import all_pids, assert_all_gone, base_env, wait_for_pidfiles, worker

from trainrun.rankset import parse_ranks

pytestmark = pytest.mark.timeout(120)

HANG = worker("diag_job.py")
QUIET = {"TRAINRUN_STALL_TIMEOUT": "600"}  # the hung job must not end in a StallError by itself


def slow_step_line() -> int:
    with open(HANG) as f:
        return next(i for i, line in enumerate(f, 1) if "rank 1 hangs here" in line)


class Reader:
    """Collects a Popen's stderr lines in a thread."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._t.start()

    def _read(self, stream):
        for line in iter(stream.readline, b""):
            self.lines.append(line.decode(errors="replace").rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines:
                if re.search(pattern, line):
                    return line
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} not in stderr:\n" + "\n".join(self.lines))

    def text(self) -> str:
        return "\n".join(self.lines)


def assert_two_groups(text: str, ranks_waiting: str = "ranks 0,2,3") -> None:
    """The acceptance shape: rank 1 in slow_step at its file:line, the others in allreduce."""
    assert "stacks of 4 rank(s)" in text and ": 2 different" in text, text
    assert re.search(rf"^rank 1: slow_step \(diag_job\.py:{slow_step_line()}\) <- hang \(diag_job\.py:\d+\)$", text, re.M), text
    assert re.search(rf"^{ranks_waiting}: allreduce <- hang \(diag_job\.py:\d+\)$", text, re.M), text


@pytest.mark.parametrize("py_spy", ["1", "off"])
def test_sigusr1_prints_stacks_grouped_and_the_job_goes_on(start_trainrun, tmp_path, py_spy):
    out = tmp_path / "out"
    proc = start_trainrun("--output-dir", out, "-np", 4, sys.executable, HANG, tmp_path, "hang",
                          env=base_env(TRAINRUN_PY_SPY=py_spy, **QUIET))
    err = Reader(proc.stderr)
    recs = wait_for_pidfiles(tmp_path, 4, proc=proc, timeout=60)
    time.sleep(1.0)  # into slow_step / the allreduce
    proc.send_signal(signal.SIGUSR1)
    err.wait_for(r"full dumps in")
    text = err.text()
    assert_two_groups(text)
    dump = (out / "rank.1" / "stacks.1.txt").read_text()
    assert "slow_step" in dump and ("py-spy" if py_spy == "1" else "faulthandler") in dump
    if py_spy == "1":
        assert "Thread" in dump and "trainrun-engine" in (out / "rank.0" / "stacks.1.txt").read_text()  # all threads
    time.sleep(0.5)
    assert proc.poll() is None, "the job must go on after a SIGUSR1 dump"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(15) == 130
    assert_all_gone(all_pids(recs))


def test_hang_timeout_dumps_and_exits_124(run_trainrun, tmp_path):
    t0 = time.monotonic()
    run = run_trainrun("--hang-timeout", 5, "-np", 4, sys.executable, HANG, tmp_path, "hang",
                       env=base_env(**QUIET), timeout=90)
    assert run.rc == 124, run.stderr
    assert_two_groups(run.stderr)
    assert "no output and no runtime progress from any rank for 5s (--hang-timeout)" in run.stderr
    assert time.monotonic() - t0 > 5
    assert_all_gone(all_pids(wait_for_pidfiles(tmp_path, 4, timeout=0)))


def test_stall_error_takes_the_stacks_then_ends_the_job(start_trainrun, tmp_path):
    """The runtime's StallError on the waiting ranks makes the launcher take every rank's stack (rank 1
    is found in slow_step), then end the job itself, exit 1, naming rank 1: the ranks that raised it
    would hang in MPI_Finalize while rank 1 sleeps (issue 38; this job once needed a Ctrl-C)."""
    proc = start_trainrun("-np", 4, sys.executable, HANG, tmp_path, "hang", env=base_env(TRAINRUN_STALL_TIMEOUT="2"))
    err = Reader(proc.stderr)
    err.wait_for(r"^trainrun: stacks of 4 rank\(s\) \(rank \d waited 2 s in '.*', which rank 1 did not submit\)",
                 timeout=60)
    err.wait_for(rf"^rank 1: slow_step \(diag_job\.py:{slow_step_line()}\)")
    assert proc.wait(30) == 1
    text = err.text()
    assert "StallError: Stalled for more than 2 s" in text
    assert re.search(r"^trainrun: rank 1 on \S+ \(local rank 1\) took no part in it \(it runs: its stack is above\) "
                     r"while ranks 0,2,3 waited in '.*' \(not submitted by rank 1 within the 2 s stall timeout\)",
                     text, re.M), text


def test_first_failure_by_time_names_the_killed_rank(run_trainrun, tmp_path):
    """Rank 2 is SIGKILLed; its exit is reported late (a child holds its output) while the others fail
    in their next allreduce: the summary still names rank 2 first, the others as consequences."""
    run = run_trainrun("-v", "-np", 4, sys.executable, HANG, tmp_path, "kill", 2, timeout=90)
    log = [line for line in run.stderr.splitlines() if re.match(r"trainrun: rank \d exited with", line)]
    assert log[0] != "trainrun: rank 2 exited with -9", f"rank 2 was reported first: the test proves nothing\n{run.stderr}"
    assert run.rc == 137, run.stderr
    summary = [line for line in run.stderr.splitlines() if line.startswith(("trainrun: rank 2 on", "trainrun: then", "  "))]
    assert summary[0] == "trainrun: rank 2 on localhost (local rank 2) was killed by SIGKILL (the first failure); stopped all 4 rank(s)", run.stderr
    text = "\n".join(summary)
    assert "probably consequences" in text, run.stderr
    assert re.search(r"^  rank 0 on localhost \(local rank 0\) exited with code 1, [\d.]+s later: rank 0: connection reset by rank 2$",
                     text, re.M), run.stderr


def test_first_failure_is_the_rank_that_raised_not_those_it_stopped(run_trainrun, tmp_path):
    """Rank 1 raises; trainrun fails the others' collectives with "rank 1 stopped" and they exit at once,
    while rank 1 is still exiting (trainrun then stops it: no failure of its own on record). The summary
    still names rank 1 first, with its traceback, and the others as consequences; the exit code is 1."""
    run = run_trainrun("-v", "-np", 3, sys.executable, HANG, tmp_path, "raise", 1, timeout=90)
    log = [line for line in run.stderr.splitlines() if re.match(r"trainrun: rank \d exited with", line)]
    assert log and log[0] != "trainrun: rank 1 exited with 1", f"rank 1 exited first: the test proves nothing\n{run.stderr}"
    assert run.rc == 1, run.stderr
    lines = run.stderr.splitlines()
    first = next(line for line in lines if "(the first failure)" in line)
    assert first.startswith("trainrun: rank 1 on localhost (local rank 1) "), run.stderr
    assert "  | RuntimeError: bad batch on rank 1" in lines, run.stderr
    assert re.search(r"^  rank [02] on localhost \(local rank [02]\) exited with code 1, [\d.]+s (later|earlier): "
                     r".*HorovodInternalError: trainrun: rank 1 stopped: ", run.stderr, re.M), run.stderr


def test_setsid_grandchildren_killed_after_fail_fast(run_trainrun, tmp_path):
    run = run_trainrun("-np", 3, sys.executable, HANG, tmp_path, "setsid", 1)
    assert run.rc == 3, run.stderr
    recs = wait_for_pidfiles(tmp_path, 3, timeout=0)
    assert all(r["grandchild"] for r in recs.values())
    assert_all_gone(all_pids(recs), 5.0, "ranks or setsid grandchildren survived fail-fast")


def test_setsid_grandchildren_killed_after_ctrl_c(start_trainrun, tmp_path):
    proc = start_trainrun("-np", 3, sys.executable, HANG, tmp_path, "setsid")
    recs = wait_for_pidfiles(tmp_path, 3, proc=proc)
    gc = recs[0]["grandchild"]
    assert os.getsid(gc) != os.getsid(recs[0]["pid"]), "the grandchild must have left its rank's session"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(15) == 130
    assert_all_gone(all_pids(recs), 5.0, "ranks or setsid grandchildren survived Ctrl-C")


def test_setsid_grandchildren_killed_after_launcher_sigkill(start_trainrun, tmp_path):
    proc = start_trainrun("-np", 3, sys.executable, HANG, tmp_path, "setsid")
    recs = wait_for_pidfiles(tmp_path, 3, proc=proc)
    proc.kill()
    proc.wait(5)
    assert_all_gone(all_pids(recs), 5.0, "ranks or setsid grandchildren survived the launcher's SIGKILL")


def test_setsid_grandchild_of_a_clean_job_is_killed(run_trainrun, tmp_path):
    """A job whose ranks all exit 0 still leaves nothing behind."""
    code = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
            f"start_new_session=True); open(r'{tmp_path}/gc', 'w').write(str(p.pid))")
    run = run_trainrun("-np", 1, sys.executable, "-c", code)
    assert run.rc == 0, run.stderr
    assert_all_gone([int((tmp_path / "gc").read_text())], 5.0)


FOLD_CODE = """
import os, sys, time
d, r, n = sys.argv[1], os.environ['RANK'], int(os.environ['WORLD_SIZE'])
open(os.path.join(d, 'ready.' + r), 'w').close()
while len([f for f in os.listdir(d) if f.startswith('ready.')]) < n:
    time.sleep(0.01)
for i in range(100):
    print('step', i, 'loss 0.5')
print('only rank', r)
"""


def test_fold_100_identical_lines_of_8_ranks(run_trainrun, tmp_path):
    run = run_trainrun("--fold", "-np", 8, sys.executable, "-c", FOLD_CODE, tmp_path, timeout=60)
    assert run.rc == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[:100] == [f"[0-7]<stdout>:step {i} loss 0.5" for i in range(100)], run.stdout
    assert sorted(lines[100:]) == sorted(f"[{r}]<stdout>:only rank {r}" for r in range(8))


TQDM_CODE = """
import sys, time
from tqdm import tqdm
for _ in tqdm(range(60), file=sys.stderr, mininterval=0, ncols=60):
    time.sleep(0.01)
print('done')
"""


def test_fold_tqdm_bars_of_4_ranks_stay_one_line_per_rank_set(run_trainrun, tmp_path):
    pytest.importorskip("tqdm", reason="tqdm not installed (pip install trainrun[test])")
    run = run_trainrun("--fold", "-np", 4, sys.executable, "-c", TQDM_CODE, timeout=60)
    assert run.rc == 0, run.stderr
    assert "\r" not in run.stderr
    bars = [line for line in run.stderr.splitlines() if "|" in line]
    assert 1 <= len(bars) <= 4, run.stderr  # the final state of each rank's bar (folded if identical)
    assert all("100%" in b and "60/60" in b for b in bars), bars
    covered = set()
    for b in bars:
        covered |= set(parse_ranks(b[1:b.index("]")]))
    assert covered == {0, 1, 2, 3}
    default = run_trainrun("-np", 4, sys.executable, "-c", TQDM_CODE, timeout=60)
    assert default.stderr.count("\r") > 4 * 50, "without --fold the bar's updates are passed on as they are"


def test_ranks_shows_only_those_and_output_dir_has_all(run_trainrun, tmp_path):
    out = tmp_path / "out"
    run = run_trainrun("--ranks", "0,3", "--output-dir", out, "-np", 4, sys.executable, "-c",
                       "import os; print('hi', os.environ['RANK'])")
    assert run.rc == 0, run.stderr
    assert sorted(run.stdout.splitlines()) == ["[0]<stdout>:hi 0", "[3]<stdout>:hi 3"]
    assert [(out / f"rank.{r}" / "stdout").read_text() for r in range(4)] == [f"hi {r}\n" for r in range(4)]


@pytest.mark.parametrize("ranks, needle", [("0,9", "the job has ranks 0-3, not 9"), ("x", "'x' is not a rank")])
def test_ranks_bad_input_is_a_usage_error(run_trainrun, ranks, needle):
    from launch_helpers import assert_one_line_error

    assert_one_line_error(run_trainrun("--ranks", ranks, "-np", 4, "true"), 2, needle)


@pytest.fixture
def memory_cgroup():
    """A fresh cgroup v1 memory cgroup limited to 80 MB (removed afterwards)."""
    root = "/sys/fs/cgroup/memory"
    path = os.path.join(root, f"trainrun-test-{os.getpid()}")
    try:
        os.mkdir(path)
        with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(80 << 20))
    except OSError as err:
        pytest.skip(f"cannot make a memory cgroup under {root} ({err.strerror}): needs root and cgroup v1")
    yield path
    for _ in range(50):
        try:
            os.rmdir(path)
            return
        except OSError:
            time.sleep(0.1)


def test_oom_killed_rank_is_named_as_such(run_trainrun, memory_cgroup):
    code = (f"import os; open({memory_cgroup + '/cgroup.procs'!r}, 'w').write(str(os.getpid())); "
            "a = []\nwhile True: a.append(bytearray(8 << 20))")
    run = run_trainrun("-np", 2, sys.executable, "-c", f"import os, time\nif os.environ['RANK'] == '1':\n    exec({code!r})\ntime.sleep(60)")
    assert run.rc == 137, run.stderr
    assert "rank 1 on localhost (local rank 1) was killed by SIGKILL (out of memory)" in run.stderr, run.stderr
    assert "rank 1: out of memory: the kernel's OOM killer killed it" in run.stderr, run.stderr
