"""`trainrun --monitor` for real: 16 local ranks in a tmux pane of 80x24 (a terminal: the table redraws in
place, the ranks' output scrolls above it, the view ends with the job and leaves the terminal usable);
piped (no terminal): plain `trainrun: monitor:` lines, and --json's straggler events; --output-dir's plot.
The ranks run tests/process/workers/straggler_allreduce.py (numpy, plain blocking allreduces), one rank
slowed so that the view has a straggler to mark."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid

import pytest
from launch_helpers import base_env, worker

import trainrun

pytestmark = pytest.mark.timeout(400)

JOB = worker("straggler_allreduce.py")
SRC = os.path.dirname(os.path.dirname(trainrun.__file__))


@pytest.fixture
def tmux():
    """tmux(*args) -> stdout, on a server of this test's own (its socket), killed at the end."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux not installed (scripts/setup.sh --test installs it)")
    sock = f"trainrun-test-{uuid.uuid4().hex[:8]}"

    def run(*args) -> str:
        return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=30).stdout
    yield run
    run("kill-server")


def test_monitor_in_an_80x24_terminal_with_16_ranks(tmux, tmp_path):
    script = tmp_path / "job.sh"
    env = " ".join(shlex.quote(f"{k}={v}") for k, v in base_env(SECONDS_TO_RUN="60", SLOW_RANK="5", PYTHONPATH=SRC).items()
                   if k in ("PYTHONPATH", "SECONDS_TO_RUN", "SLOW_RANK", "PATH"))
    script.write_text(f"cd {tmp_path}\nenv {env} {sys.executable} -m trainrun -np 16 --monitor {sys.executable} {JOB}\n"
                      f"echo MONITOR-EXIT=$?\nsleep 600\n")
    tmux("new-session", "-d", "-s", "mon", "-x", "80", "-y", "24", f"sh {script}")
    frames, deadline = [], time.monotonic() + 300
    while time.monotonic() < deadline:
        pane = tmux("capture-pane", "-p", "-t", "mon")
        frames.append(pane)
        if "MONITOR-EXIT=" in pane:
            break
        time.sleep(1)
    final = frames[-1]
    assert "MONITOR-EXIT=0" in final, final
    tables = [f for f in frames if "trainrun --monitor: 16 ranks on 1 host(s)" in f]
    full = [f for f in tables if all(re.search(rf"^ *(> )?rank {r} +{r} ", f, re.M) for r in range(16))]
    assert full, tables[-1] if tables else frames[-1]
    for f in tables:  # in place: one table on the screen at any time, never a row wrapped past 80 columns
        assert f.count("trainrun --monitor:") == 1, f
        for row in re.findall(r"^ *(?:> )?rank \d+ .*$", f, re.M):
            assert row.rstrip().endswith("MiB"), f
    stamps = {re.search(r"host\(s\), (\d\d:\d\d:\d\d)", f).group(1) for f in tables}
    assert len(stamps) >= 3, stamps  # it redrew as windows came
    # a mark, if any, is on the slowed rank (16 ranks on 2 cores are not always named within the run: the rule's
    # business, tests/process/test_straggler.py; the mark itself: tests/unit/test_monitor.py and the test below)
    marked = [f for f in tables if re.search(r"^ *> rank \d+ ", f, re.M)]
    assert all(re.search(r"^ *> rank 5 ", f, re.M) and "straggler: rank 5 on localhost" in f for f in marked), marked
    assert re.search(r"^ *rank 5 +5 .* (\d+)% +(\d+)% +(\d+)% ", full[-1], re.M)
    # it ended with the job: the last table still on screen, once, above the exit line; nothing left running
    assert final.count("trainrun --monitor:") == 1 and final.index("trainrun --monitor:") < final.index("MONITOR-EXIT")
    out = subprocess.run(["pgrep", "-f", str(JOB)], capture_output=True, text=True).stdout.split()
    assert out == [], out


def test_off_a_terminal_plain_lines_json_events_and_the_plot(start_trainrun, tmp_path):
    proc = start_trainrun("-np", 4, "--monitor", "--json", "--output-dir", tmp_path / "out", sys.executable, JOB,
                          env=base_env(SECONDS_TO_RUN="40", SLOW_RANK="1"))
    out, err = proc.communicate(timeout=300)
    err = err.decode(errors="replace")
    assert proc.returncode == 0, err
    assert "\x1b[" not in err and "\x1b[" not in out.decode()  # no terminal control off a terminal
    plain = [x for x in err.splitlines() if x.startswith("trainrun: monitor: ")]
    assert {re.match(r"trainrun: monitor: (?:> )?rank (\d) \[\d\]: ", x).group(1) for x in plain} == {"0", "1", "2", "3"}
    assert all(re.search(r"[\d.]+ collectives/s, compute \d+%, wait \d+%, last \d+%, allreduce [\d.]+ [KMG]?B/s, "
                         r"memory \d+ MiB", x) for x in plain), plain
    events = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "straggler" and kinds[-1] == "straggler_summary", err
    assert events[0]["ranks"] == [1] and events[0]["message"].startswith("straggler: rank 1 on localhost")
    assert not re.search(r"^trainrun: straggler", err, re.M), err  # --json: events instead of the text lines
    assert any(x.endswith("<- straggler") and "> rank 1 [1]" in x for x in plain), plain
    page = (tmp_path / "out" / "straggler.html").read_text()
    for r in range(4):
        assert page.count(f'data-rank="{r}"') == 2, r


@pytest.mark.parametrize("option", ["", "--monitor"])
def test_the_view_is_loaded_only_when_asked_and_rich_only_on_a_terminal(option):
    """The launch path's import rule (docs/architecture.md): a launch without --monitor/--json imports neither
    supervisor/monitor.py nor rich; --monitor off a terminal needs the module, not rich."""
    argv = [sys.executable, "-X", "importtime", "-m", "trainrun", "-np", "2", *([option] if option else []), "true"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=base_env(PYTHONPATH=SRC))
    assert proc.returncode == 0, proc.stderr
    modules = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert not any(m == "rich" or m.startswith("rich.") for m in modules)
    assert ("trainrun.supervisor.monitor" in modules) == bool(option)
