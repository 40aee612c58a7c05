"""What a job leaves on this machine (issue 38, items 4 and 5), with real ranks in a real MPI world.

- Stack files (the ranks' faulthandler files, runtime/rankhook.py) live in the job's directory on the host, which
  the ranks' owner removes: none is left after a rank was SIGKILLed, nor after the launcher was (its watchdog
  removes them with the job's /dev/shm segments).
- A /dev/shm too small for the MPI world (a private mount namespace with a 2 MiB tmpfs on /dev/shm) is named
  before any rank starts, with exit 3 and no restart spent; one rank, which fits, runs.
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import pytest
from launch_helpers import worker

from trainrun.mpiworld.shm import kvsname_for, shm_segment_pattern

pytestmark = pytest.mark.timeout(120)

SLEEPER = worker("mpi_sleep.py")
GONE_S = 10.0  # generous upper bound for a cleanup on a busy 2-core box


def ups(stdout: str) -> dict[int, tuple[str, str]]:
    """rank -> (job id, stack file) from mpi_sleep.py's `[R]<stdout>:up JOB FILE` lines."""
    out = {}
    for line in stdout.splitlines():
        head, _, rest = line.partition("<stdout>:up ")
        if rest:
            job, path = rest.split()
            out[int(head.strip("[]"))] = (job, path)
    return out


def leftovers(job: str, paths) -> list[str]:
    """The job's stack files and stack-file directories, and its MPICH segments, still on this machine."""
    pattern = shm_segment_pattern(kvsname_for(job))
    left = [p for p in paths if os.path.exists(p)]
    left += glob.glob(os.path.join(tempfile.gettempdir(), f"trainrun-stacks-{job}-*"))
    return left + [f"/dev/shm/{n}" for n in os.listdir("/dev/shm") if pattern.fullmatch(n)]


def wait_clean(job: str, paths, timeout: float = GONE_S) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := leftovers(job, paths)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_a_sigkilled_rank_leaves_no_stack_file(run_trainrun):
    """Rank 1 SIGKILLs itself after MPI_Init: exit 137, and neither rank's stack file, nor the job's stack-file
    directory, nor its MPICH segment is left. The files were in that directory (not loose in /tmp, where
    only a rank's own atexit would remove its file)."""
    token = f"killrank{uuid.uuid4().hex[:8]}"
    run = run_trainrun("-np", 2, sys.executable, SLEEPER, 60, token, "kill", 1, timeout=90)
    assert run.rc == 137, run.stderr
    up = ups(run.stdout)
    assert sorted(up) == [0, 1], run.stdout
    job = up[0][0]
    paths = [path for _job, path in up.values()]
    assert all(os.path.dirname(p) == os.path.join(tempfile.gettempdir(), f"trainrun-stacks-{job}-localhost")
               for p in paths), paths
    assert leftovers(job, paths) == []


def test_a_sigkilled_launcher_leaves_no_stack_file(start_trainrun):
    """The launcher is SIGKILLed while its 2 ranks sleep in the MPI world: within seconds its watchdog has
    killed them and removed their stack files (they ran no atexit), the job's directory and its segment."""
    token = f"killlauncher{uuid.uuid4().hex[:8]}"
    proc = start_trainrun("-np", 2, sys.executable, SLEEPER, 600, token)
    lines = [proc.stdout.readline().decode() for _ in range(2)]
    up = ups("".join(lines))
    assert sorted(up) == [0, 1], lines
    job = up[0][0]
    paths = [path for _job, path in up.values()]
    assert all(os.path.exists(p) for p in paths), paths
    assert any(shm_segment_pattern(kvsname_for(job)).fullmatch(n) for n in os.listdir("/dev/shm"))
    proc.kill()
    proc.wait(5)
    assert wait_clean(job, paths) == [], "left after the launcher's SIGKILL"


# --- a full /dev/shm -----------------------------------------------------------------------------------

def small_shm_argv(size: str, *args) -> list[str]:
    """trainrun with `args`, in a private mount namespace whose /dev/shm is a `size` tmpfs."""
    launch = " ".join(map(str, [sys.executable, "-m", "trainrun", *args]))
    return ["unshare", "--mount", "sh", "-c", f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {launch}"]


@pytest.fixture
def small_shm():
    """Runs a launch under a 2 MiB /dev/shm of its own; skips where mount namespaces cannot be made."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare (a private mount namespace with its own /dev/shm)")
    probe = subprocess.run(["unshare", "--mount", "sh", "-c", "mount -t tmpfs -o size=2M tmpfs /dev/shm"],
                           capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace: {probe.stderr.strip()}")

    def run(*args):
        return subprocess.run(small_shm_argv("2M", *args), capture_output=True, text=True, timeout=90)

    return run


SHORT = ("trainrun: error: localhost: /dev/shm has 2 MiB free, the MPI world needs 2.1 MiB for its 2 rank(s) "
         "there (free space there, e.g. remove old /dev/shm files, or run fewer ranks on it; MPI ranks would die of SIGBUS)")


def test_a_full_dev_shm_is_named_before_any_rank_starts(small_shm):
    """2 ranks need 2.1 MiB of MPICH's segment: exit 3 and the one line, no rank started (no SIGBUS)."""
    r = small_shm("-np", 2, sys.executable, SLEEPER, 0)
    assert r.returncode == 3, r.stderr
    assert r.stderr.strip() == SHORT, r.stderr
    assert r.stdout == ""


def test_a_dev_shm_with_room_for_one_rank_runs_it(small_shm):
    """The need is not over-estimated: one rank (1.1 MiB) forms its world in the same 2 MiB."""
    r = small_shm("-np", 1, sys.executable, SLEEPER, 0)
    assert r.returncode == 0, r.stderr
    assert "up " in r.stdout


def test_a_full_dev_shm_spends_no_restart(small_shm):
    """An elastic job on that /dev/shm ends at once with the same line and exit 3, no attempt failed."""
    r = small_shm("--max-restarts", 3, "-np", 2, sys.executable, SLEEPER, 0)
    assert r.returncode == 3, r.stderr
    assert r.stderr.strip() == SHORT, r.stderr
