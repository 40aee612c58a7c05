"""Parameter-server clusters on this machine, real TensorFlow, real processes (--tf-cluster): the examples
train (loss falls, variables on both ps), the chief's success ends the job and nothing is left, a SIGKILLed
worker is restarted and the job still exits 0, a SIGKILLed ps fails the job naming it, a failing chief's exit
code is the job's, and the TF1 between-graph program reaches its global step. TF import is slow on a loaded
box: the programs are tiny and the limits generous."""
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow not installed: pip install 'trainrun[tensorflow]'", allow_module_level=True)

pytestmark = pytest.mark.timeout(420)
ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples" / "tensorflow"
WORKERS = Path(__file__).parent / "workers"
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
LIMIT = 360


class Launch:
    """trainrun running in the background; its stdout+stderr collected line by line."""

    def __init__(self, *args, cwd):
        self.proc = subprocess.Popen([sys.executable, "-m", "trainrun", "--grace", "2", *map(str, args)], cwd=cwd,
                                     env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    def wait_for(self, needle: str, timeout: float = LIMIT) -> None:
        deadline = time.monotonic() + timeout
        while not any(needle in line for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no {needle!r} in the output:\n{self.text}")
            time.sleep(0.1)

    def wait(self) -> int:
        try:
            rc = self.proc.wait(LIMIT)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            pytest.fail(f"trainrun did not end in {LIMIT}s:\n{self.text}")
        self._reader.join(10)
        return rc

    @property
    def text(self) -> str:
        return "".join(self.lines)


def task_pid(token: str, role: str, index: int) -> int:
    """The pid of the job's process (its command line holds `token`) that plays `role` `index`."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if token.encode() not in f.read():
                    continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        except OSError:
            continue
        if env.get(b"TRAINRUN_ROLE") == role.encode() and env.get(b"TRAINRUN_ROLE_INDEX") == str(index).encode():
            return int(name)
    pytest.fail(f"no {role} {index} process with {token!r}")


def assert_nothing_left(token: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        left = []
        for name in os.listdir("/proc"):
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    hit = name.isdigit() and token.encode() in f.read()
                with open(f"/proc/{name}/stat") as f:
                    hit = hit and f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
            except OSError:
                continue
            if hit:
                left.append(int(name))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the job left: {left}"


def ps_strategy(tmp_path, *extra):
    out = tmp_path / "chief.json"
    return out, Launch("-np", 5, "--tf-cluster", "ps=2", sys.executable, EXAMPLES / "ps_strategy.py",
                       "--out", out, *extra, cwd=tmp_path)


def test_chief_finishing_ends_the_job_loss_falls_variables_on_both_ps(tmp_path):
    out, run = ps_strategy(tmp_path, "--steps", "60")
    assert run.wait() == 0, run.text
    doc = json.loads(out.read_text())
    losses = doc["losses"]
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10, losses
    assert {d.split("/")[3] for d in doc["devices"].values()} == {"task:0", "task:1"}
    assert all("/job:ps/" in d for d in doc["devices"].values()), doc["devices"]
    assert "trainrun:" not in run.text, run.text  # the ps and workers stopped after the chief: no failure line
    assert_nothing_left(str(out))


def test_a_killed_worker_is_restarted_and_the_job_succeeds(tmp_path):
    out, run = ps_strategy(tmp_path, "--steps", "400")
    run.wait_for("variables on")
    os.kill(task_pid(str(out), "worker", 1), signal.SIGKILL)
    assert run.wait() == 0, run.text
    assert "trainrun: worker 1 (rank 2 on localhost) was killed by SIGKILL: restarting it there as worker 1 " \
           "(restart 1 of 3)" in run.text, run.text
    assert len(json.loads(out.read_text())["losses"]) == 400
    assert_nothing_left(str(out))


def test_a_killed_ps_fails_the_job_naming_it(tmp_path):
    out, run = ps_strategy(tmp_path, "--steps", "400")
    run.wait_for("variables on")
    os.kill(task_pid(str(out), "ps", 1), signal.SIGKILL)
    assert run.wait() == 128 + signal.SIGKILL, run.text
    summary = [line for line in run.lines if line.startswith("trainrun: ")]
    assert summary and summary[0].startswith("trainrun: ps 1 (rank 4 on localhost) was killed by SIGKILL"), run.text
    assert_nothing_left(str(out))


def test_a_failing_chief_gives_its_exit_code(tmp_path):
    run = Launch("-np", 4, "--tf-cluster", "ps=1", sys.executable, WORKERS / "chief_exits.py", tmp_path, cwd=tmp_path)
    assert run.wait() == 5, run.text
    assert "trainrun: chief 0 (rank 0 on localhost) exited with code 5" in run.text
    assert_nothing_left(str(WORKERS / "chief_exits.py"))


def test_tf1_between_graph_reaches_its_global_step(tmp_path):
    out = tmp_path / "tf1.json"
    run = Launch("-np", 3, "--tf-cluster", "ps=1", sys.executable, EXAMPLES / "ps_tf1.py", "--target", 60,
                 "--out", out, cwd=tmp_path)
    assert run.wait() == 0, run.text
    doc = json.loads(out.read_text())
    assert doc["global_step"] >= 60
    assert sum(doc["losses"][-5:]) < sum(doc["losses"][:5])
    assert_nothing_left(str(out))


def test_keras_fit_with_tf_keras(tmp_path):
    out = tmp_path / "keras.json"
    run = Launch("-np", 4, "--tf-cluster", "ps=1", sys.executable, EXAMPLES / "ps_keras.py", "--epochs", 4,
                 "--steps", 4, "--out", out, cwd=tmp_path)
    assert run.wait() == 0, run.text
    assert "chief: tf-keras, fit 4 epochs" in run.text
    assert len(json.loads(out.read_text())["losses"]) == 4
    assert_nothing_left(str(out))
