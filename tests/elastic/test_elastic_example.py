"""examples/elastic_torch.py, the elastic guide's example (docs/guides/elastic.md), run elastic as a user would: a rank SIGKILLed
mid-run, the job restarted from the state committed before the kill, exit 0, nothing left."""
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.elastic.harness import LiveRun, leftover_segments, procs_with, wait_gone

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(600)  # each attempt starts 2-3 ranks that import torch on 2 shared cores

EXAMPLE = Path(__file__).parents[2] / "examples" / "elastic_torch.py"
PIPE = [sys.executable, str(Path(__file__).parent / "pipe_trainrun.py")]
POINT = re.compile(r"epoch (\d+) sample (\d+)")
EPOCHS, SAMPLES, BATCH, COMMIT_EVERY = 4, 2048, 32, 20  # --epochs, --samples, and the example's defaults


def rank_pid(script: str, rank: int, timeout: float = 60.0) -> int:
    """The pid of rank `rank` running `script`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in psutil.process_iter(["cmdline"]):
            if script in (p.info["cmdline"] or ()):
                try:
                    if p.environ().get("RANK") == str(rank):
                        return p.pid
                except psutil.Error:
                    pass
        time.sleep(0.1)
    raise AssertionError(f"no rank {rank} of {script}")


@pytest.fixture
def script(tmp_path):
    """A copy of the example at a path of its own: this job's processes (launcher, ranks) are found by it, and
    what a failing test leaves is killed."""
    path = str(tmp_path / "elastic_torch.py")
    shutil.copy(EXAMPLE, path)
    yield path
    for p in procs_with(path):
        try:
            p.kill()
        except psutil.Error:
            pass


def test_elastic_example_resumes_from_its_last_commit_after_a_rank_is_killed(tmp_path, script):
    run = LiveRun(["-v", "-np", "2", "--max-restarts", "1", script, "--epochs", str(EPOCHS), "--samples", str(SAMPLES)], cwd=tmp_path,
                  env={"OMP_NUM_THREADS": "1"})
    run.wait_for("attempt 0: 2 ranks, lr 0.04, from epoch 0 sample 0", timeout=180)
    run.wait_for("(committed)", timeout=120)
    os.kill(rank_pid(script, 1), signal.SIGKILL)
    resumed = run.wait_for("attempt 1: 2 ranks", timeout=180)
    assert run.finish(timeout=300) == 0, run.stderr[-3000:]

    text = [line.partition("<stdout>:")[2] for line in run.lines if line.startswith("[0]")]
    first = text.index(resumed.partition("<stdout>:")[2])
    commits_before = [POINT.search(t).groups() for t in text[:first] if t.endswith("(committed)")]
    assert commits_before, text[:first]
    # the new attempt starts where the last commit of the first one left off, not from scratch: at the last
    # commit rank 0 printed, or at the next (rank 0 printed its line only if rank 1 lived to finish that commit)
    at = lambda e, s: int(e) * SAMPLES + int(s)  # noqa: E731
    ahead = at(*POINT.search(resumed).groups()) - at(*commits_before[-1])
    assert 0 <= ahead <= COMMIT_EVERY * 2 * BATCH, (resumed, commits_before)
    assert text[-1] == f"done: {EPOCHS} epochs", text[-5:]
    losses = [float(t.split("loss ")[1].split()[0]) for t in text if t.endswith("(committed)")]
    assert losses[-1] < 0.5 * losses[0], losses
    assert "restart 1 of 1" in run.stderr, run.stderr[-3000:]
    assert wait_gone(script) == [] and leftover_segments(run.stderr) == []


def test_elastic_example_shrinks_when_a_host_dies(tmp_path, script):
    """--min-np 2 on 3 hosts (agents as local subprocesses, test_elastic_pipe.py's engine): far3's rank dies,
    far3 sits out, the job goes on with 2 ranks from the last commit, at 2 ranks' learning rate (the reset
    callback; the committed optimizer state holds 3 ranks' 0.06) and the next samples of the epoch."""
    run = LiveRun(["-v", "-H", "far1:1,far2:1,far3:1", "--min-np", "2", script, "--epochs", str(EPOCHS), "--samples", str(SAMPLES)],
                  cwd=tmp_path, env={"OMP_NUM_THREADS": "1"}, launcher=PIPE)
    run.wait_for("attempt 0: 3 ranks, lr 0.06, from epoch 0 sample 0", timeout=180)
    run.wait_for("(committed)", timeout=120)
    os.kill(rank_pid(script, 2), signal.SIGKILL)
    resumed = run.wait_for("attempt 1: ", timeout=180)
    assert "attempt 1: 2 ranks, lr 0.04, from epoch " in resumed, resumed
    assert run.finish(timeout=300) == 0, run.stderr[-3000:]
    text = [line.partition("<stdout>:")[2] for line in run.lines if line.startswith("[0]")]
    first = text.index(resumed.partition("<stdout>:")[2])
    commits_before = [POINT.search(t).groups() for t in text[:first] if t.endswith("(committed)")]
    at = lambda e, s: int(e) * SAMPLES + int(s)  # noqa: E731
    ahead = at(*POINT.search(resumed).groups()) - at(*commits_before[-1])
    assert 0 <= ahead <= COMMIT_EVERY * 3 * BATCH, (resumed, commits_before)  # from the last commit on
    assert text[-1] == f"done: {EPOCHS} epochs", text[-5:]
    assert "far3 sits out for good" in run.stderr, run.stderr[-3000:]
    assert wait_gone(script) == [] and leftover_segments(run.stderr) == []


def test_guide_snippet_is_an_excerpt_of_the_example():
    """The elastic guide's snippet (docs/guides/elastic.md; it was the README's) is the example's code, lines in
    the same order (printing left out): no undefined names such as the `step`, `batches`, `set_lr` of the snippet
    before the example existed."""
    guide = (Path(__file__).parents[2] / "docs" / "guides" / "elastic.md").read_text()
    section = guide[guide.index("# Elastic training"):]
    snippet = section[section.index("```python\n") + 10:]
    snippet = [line.strip() for line in snippet[:snippet.index("```")].splitlines() if line.strip()]
    example = [line.strip() for line in EXAMPLE.read_text().splitlines()]
    at = 0
    for line in snippet:
        assert line in example[at:], f"guide snippet line not in the example (in order): {line!r}"
        at = example.index(line, at) + 1
