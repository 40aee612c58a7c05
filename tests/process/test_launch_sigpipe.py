"""`trainrun ... | head`: when the reader of the launcher's output goes away the launcher ends as a program
killed by SIGPIPE would (exit 141), with no BrokenPipeError traceback; a running job is stopped first (one
line on stderr says so) and nothing is left. Real pipes into a real `head`."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from tests.process.launch_helpers import assert_all_gone

CHATTY = textwrap.dedent("""\
    import glob, os, subprocess, sys, time
    child = subprocess.Popen(["sleep", "1000"])
    with open(os.path.join(sys.argv[1], "tmp." + os.environ["RANK"]), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.rename(f.name, os.path.join(sys.argv[1], "pid." + os.environ["RANK"]))
    while len(glob.glob(os.path.join(sys.argv[1], "pid.*"))) < int(os.environ["WORLD_SIZE"]):
        time.sleep(0.01)  # every rank's pids are on record before the reader can leave
    for i in range(1_000_000):
        print(f"line {i}", flush=True)
        time.sleep(0.005)
""")


def piped_to_head(args: list, tmp_path, lines: int = 2, both: bool = False, timeout: float = 60):
    """Run `trainrun ARGS | head -n LINES` (`both`: `2>&1 |`); (launcher's exit code, head's output, launcher's stderr)."""
    head = subprocess.Popen(["head", "-n", str(lines)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tmp_path)
    launcher = subprocess.Popen([sys.executable, "-m", "trainrun", *map(str, args)], stdout=head.stdin,
                                stderr=head.stdin if both else subprocess.PIPE, cwd=tmp_path, start_new_session=True)
    head.stdin.close()  # only the launcher holds the pipe now: it breaks when head exits
    try:
        _, err = launcher.communicate(timeout=timeout)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    shown = head.stdout.read().decode()
    head.wait(10)
    return launcher.returncode, shown, (err or b"").decode()


def job_pids(tmp_path) -> list[int]:
    return [int(p) for f in tmp_path.glob("pid.*") for p in f.read_text().split()]


def start_script(tmp_path) -> str:
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    return str(script)


@pytest.mark.parametrize("extra", [[], ["--max-restarts", "1"]], ids=["job", "elastic"])
def test_job_piped_to_head_stops_its_ranks(tmp_path, extra):
    rc, shown, err = piped_to_head(["-np", 2, *extra, sys.executable, start_script(tmp_path), tmp_path], tmp_path)
    assert rc == 141, err
    assert len(shown.splitlines()) == 2 and "line 0" in shown, shown
    assert err.splitlines() == ["trainrun: interrupted by SIGPIPE; stopped all 2 rank(s)"], err
    pids = job_pids(tmp_path)
    assert len(pids) == 4, pids
    assert_all_gone(pids, timeout=10, what="ranks and their children after the reader left")


def test_job_with_stderr_in_the_same_pipe_ends_quietly(tmp_path):
    """`trainrun ... 2>&1 | head`: the stop line itself cannot be written; before, the BrokenPipeError of that
    write reached click, which exited 1."""
    rc, shown, _ = piped_to_head(["-np", 2, sys.executable, start_script(tmp_path), tmp_path], tmp_path, both=True)
    assert rc == 141, shown
    assert "Traceback" not in shown and "BrokenPipe" not in shown, shown
    time.sleep(0.1)
    assert_all_gone(job_pids(tmp_path), timeout=10, what="ranks and their children after the reader left")


@pytest.mark.parametrize("json_", [[], ["--json"]], ids=["table", "json"])
def test_dry_run_piped_to_head_is_quiet(tmp_path, json_):
    """A plan bigger than the pipe's buffer: its print fails when head has gone (before: click's exit 1)."""
    rc, shown, err = piped_to_head(["--dry-run", *json_, "-np", 3000, "--oversubscribe", "true"], tmp_path, lines=1)
    assert (rc, err) == (141, ""), (rc, err)
    assert len(shown.splitlines()) == 1, shown
