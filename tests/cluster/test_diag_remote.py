"""In-flight diagnosis across simulated hosts: stacks of ranks on two hosts (SIGUSR1, --hang-timeout), the
first failure by time when the killed rank is on another host than the launcher's first news, and no
setsid'd grandchild left on any host after fail-fast, Ctrl-C or a SIGKILLed launcher.

The remote agents must run this checkout's trainrun (not the installed one): `--python` names a wrapper
that sets PYTHONPATH to it (the ranks get the launcher's PYTHONPATH through the env contract anyway)."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import trainrun

WORKER = str(Path(__file__).parents[1] / "process" / "workers" / "diag_job.py")
SRC = str(Path(trainrun.__file__).parents[1])
QUIET = {"TRAINRUN_STALL_TIMEOUT": "600"}


def slow_step_line() -> int:
    with open(WORKER) as f:
        return next(i for i, line in enumerate(f, 1) if "rank 1 hangs here" in line)


def argv(cluster, tmp_path, *args):
    wrapper = tmp_path / "python-here"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={SRC} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    return [sys.executable, "-m", "trainrun", "--ssh-config", str(cluster.ssh_config), "--python", str(wrapper), *map(str, args)]


def env(**extra):
    return {**os.environ, "PYTHONPATH": SRC, **extra}


def pidfiles(directory: Path, count: int, timeout: float = 60.0) -> dict[int, dict]:
    deadline = time.monotonic() + timeout
    while len(files := sorted(directory.glob("pid.*"))) < count:
        assert time.monotonic() < deadline, f"only {len(files)} of {count} ranks started"
        time.sleep(0.1)
    return {int(f.suffix[1:]): json.loads(f.read_text()) for f in files}


def left_alive(pids, seconds: float = 10.0) -> list[int]:
    """Pids (all hosts share the PID namespace) still running after `seconds`; survivors are killed."""
    deadline = time.monotonic() + seconds
    while (alive := [p for p in pids if p and _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    for p in alive:
        os.kill(p, signal.SIGKILL)
    return alive


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def assert_two_groups(text: str) -> None:
    assert "stacks of 4 rank(s)" in text and ": 2 different" in text, text
    assert re.search(rf"^rank 1: slow_step \(diag_job\.py:{slow_step_line()}\) <- hang", text, re.M), text
    assert re.search(r"^ranks 0,2,3: allreduce <- hang \(diag_job\.py:\d+\)$", text, re.M), text


def test_sigusr1_stacks_of_ranks_on_two_hosts_then_hang_timeout(cluster, tmp_path):
    out = tmp_path / "out"
    p = subprocess.Popen(argv(cluster, tmp_path, "--output-dir", out, "-H", "h1:2,h2:2", sys.executable, WORKER, tmp_path, "hang"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path, env=env(**QUIET))
    lines = []
    threading.Thread(target=lambda: lines.extend(iter(p.stderr.readline, b"")), daemon=True).start()
    try:
        pidfiles(tmp_path, 4)
        time.sleep(1.5)
        p.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while not any(b"full dumps in" in ln for ln in lines) and time.monotonic() < deadline:
            time.sleep(0.1)
        text = b"".join(lines).decode(errors="replace")
        assert_two_groups(text)
        assert "h2" in (out / "rank.3" / "stacks.1.txt").read_text()
        assert p.poll() is None, "the job goes on after SIGUSR1"
        p.send_signal(signal.SIGINT)
        assert p.wait(30) == 130
    finally:
        p.kill()
        p.wait()
    for f in tmp_path.glob("pid.*"):
        f.unlink()
    r = subprocess.run(argv(cluster, tmp_path, "--hang-timeout", 5, "-H", "h1:2,h2:2", sys.executable, WORKER, tmp_path, "hang"),
                       capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env(**QUIET))
    assert r.returncode == 124, r.stderr
    assert_two_groups(r.stderr)


def test_first_failure_on_another_host_is_named_first(cluster, tmp_path):
    """Rank 2 (on h2) is SIGKILLed; the ranks on h1 notice and fail at once and are reported first, yet
    the summary names rank 2 first: exit times come from the hosts, on the launcher's clock."""
    r = subprocess.run(argv(cluster, tmp_path, "-v", "-H", "h1:2,h2:2", sys.executable, WORKER, tmp_path, "kill", 2),
                       capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env())
    log = [line for line in r.stderr.splitlines() if re.match(r"trainrun: rank \d exited with", line)]
    assert log[0] != "trainrun: rank 2 exited with -9", f"rank 2 was reported first: the test proves nothing\n{r.stderr}"
    assert r.returncode == 137, r.stderr
    assert "trainrun: rank 2 on h2 (local rank 0) was killed by SIGKILL (the first failure)" in r.stderr, r.stderr
    assert re.search(r"^  rank [013] on h[12] \(local rank [01]\) exited with code 1, [\d.]+s later: rank \d: connection reset by rank 2$",
                     r.stderr, re.M), r.stderr


@pytest.mark.parametrize("how", ["fail-fast", "ctrl-c", "sigkill"])
def test_no_setsid_grandchild_left_on_any_host(cluster, tmp_path, how):
    args = ["-np", 6, "--hostfile", cluster.hostfile, sys.executable, WORKER, tmp_path, "setsid"]
    p = subprocess.Popen(argv(cluster, tmp_path, *args, *([1] if how == "fail-fast" else [])),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path, env=env())
    try:
        recs = pidfiles(tmp_path, 6)
        if how == "ctrl-c":
            p.send_signal(signal.SIGINT)
        elif how == "sigkill":
            p.kill()
        rc = p.wait(60)
    finally:
        p.kill()
        p.wait()
    assert rc == {"fail-fast": 3, "ctrl-c": 130, "sigkill": -9}[how], p.stderr.read().decode()
    grandchildren = [r["grandchild"] for r in recs.values()]
    assert len(grandchildren) == 6 and all(grandchildren)
    assert left_alive(grandchildren + [r["pid"] for r in recs.values()]) == []


STALL_JOB = str(Path(__file__).parents[1] / "process" / "workers" / "stall_job.py")


def test_a_stopped_rank_on_a_remote_host_ends_the_job_named(cluster, tmp_path):
    """Issue 25 item 1 across hosts: rank 3 (on h2) is SIGSTOPped in an allreduce loop; the other ranks'
    runtime reports that no round completes after the stall timeout (h1's through its agent), h2's agent
    names the stopped rank by its /proc state in the stack report, and the job ends, exit 1, naming it."""
    p = subprocess.Popen(argv(cluster, tmp_path, "-H", "h1:2,h2:2", sys.executable, STALL_JOB, tmp_path, "loop"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path,
                         env=env(TRAINRUN_STALL_TIMEOUT="3"))
    try:
        recs = pidfiles(tmp_path, 4)
        time.sleep(0.5)
        os.kill(recs[3]["pid"], signal.SIGSTOP)
        text = p.communicate(timeout=90)[1].decode(errors="replace")
        rc = p.returncode
    finally:
        p.kill()
        p.wait()
    assert rc == 1, text
    assert re.search(r"^rank 3 is stopped \(state T\)$", text, re.M), text
    assert re.search(r"^trainrun: rank 3 on h2 \(local rank 1\) is stopped \(state T\) while ranks 0-2 waited in "
                     r"allreduce 'step' \(no collective round completed for \d+ s\)", text, re.M), text
    assert left_alive([r["pid"] for r in recs.values()]) == []


def test_a_deadlocked_dataloader_on_one_host_of_four_ends_the_job_named(cluster4, tmp_path):
    """Issue 38 item 1 across hosts: rank 2 (on h3) blocks in a DataLoader whose worker is deadlocked in
    Queue.get; the others raise StallError (h2's and h4's through their agents), then hang in their own
    shutdown; the launcher takes the stacks (rank 2's through h3's agent) and ends the job, exit 1, naming
    rank 2, within the stall timeout plus the grace period plus 5 s, and nothing is left on any host."""
    p = subprocess.Popen(argv(cluster4, tmp_path, "-H", "h1:1,h2:1,h3:1,h4:1", sys.executable, STALL_JOB, tmp_path,
                              "absent", "loader", 2),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path,
                         env=env(TRAINRUN_STALL_TIMEOUT="3"))
    try:
        recs = pidfiles(tmp_path, 4)
        absent = json.loads(pidfiles_named(tmp_path, "absent.2").read_text())
        since = time.monotonic()
        text = p.communicate(timeout=120)[1].decode(errors="replace")
        took = time.monotonic() - since
        rc = p.returncode
    finally:
        p.kill()
        p.wait()
    assert rc == 1, text
    assert re.search(r"^rank 2: .*\n(    .*\n)*    stay_absent", text, re.M), text  # its stack, from h3
    assert re.search(r"^trainrun: rank 2 on h3 \(local rank 0\) took no part in it \(it runs: its stack is above\) "
                     r"while ranks 0,1,3 waited in 'x' \(not submitted by rank 2 within the 3 s stall timeout\)",
                     text, re.M), text
    assert took < 3 + 3 + 5, (took, text)
    assert left_alive([r["pid"] for r in recs.values()] + [absent["grandchild"]]) == []


def pidfiles_named(directory: Path, name: str, timeout: float = 60.0) -> Path:
    deadline = time.monotonic() + timeout
    while not (directory / name).exists():
        assert time.monotonic() < deadline, f"no {name} in {timeout}s"
        time.sleep(0.1)
    return directory / name
