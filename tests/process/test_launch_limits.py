"""Input a user hands in is read within bounds (issue 38): a hostfile (/dev/zero, 100 MB, a bad line early in a
huge file), a YAML config (an alias bomb, a big or deeply nested one, non-UTF-8) through `trainrun --config`
and `horovodrun --config-file`. Each ends in one `error:` line with exit 2, in a child whose address space is
capped at MEMORY_CAP: reading the whole input (or expanding the aliases) would end in a MemoryError's
traceback instead. How fast they end is measured by hand, not asserted (no timed tests); a hang hits the
child's timeout."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

MEMORY_CAP = 100 * 1024 * 1024  # address space of the child: the interpreter and trainrun's imports take ~50 MiB
CHILD_TIMEOUT = 60  # seconds; each case ends in well under one on an idle machine


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_capped(module: str, *args: object, cwd: Path) -> tuple[int, str]:
    """`python -m module args...` with its address space capped; (exit code, stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", module, *map(str, args)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=_cap_memory)
    try:
        _, err = proc.communicate(timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"{module} {' '.join(map(str, args))} did not end in {CHILD_TIMEOUT}s")
    return proc.returncode, err.decode(errors="replace")


def assert_usage_error(rc: int, err: str, command: str, *needles: str) -> None:
    """Exit 2, one `command: error:` line, no traceback, every needle in it."""
    err = err.strip()
    assert rc == 2, f"rc {rc}; stderr: {err[-2000:]}"
    assert len(err.splitlines()) == 1 and err.startswith(f"{command}: error: "), err[-2000:]
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"


def write_big(path: Path, line: bytes, size: int = 100_000_000, head: bytes = b"") -> Path:
    """`head`, then `line` repeated up to `size` bytes."""
    chunk = line * (1_000_000 // len(line))
    with open(path, "wb") as f:
        f.write(head)
        for _ in range(size // len(chunk)):
            f.write(chunk)
    return path


# hostfiles

def test_hostfile_dev_zero_is_refused_at_its_first_line(tmp_path):
    """Before: no output, 5.8 GB after 10 s and growing."""
    rc, err = run_capped("trainrun", "--hostfile", "/dev/zero", "x.py", cwd=tmp_path)
    assert_usage_error(rc, err, "trainrun", "/dev/zero:1: line longer than 4096 bytes")


@pytest.mark.parametrize("line, needle", [
    (b"# a comment that makes the file big, and nothing else\n", "more than 4 MiB"),
    (b"node%d.cluster.example.com slots=8\n", "more than 65536 hosts"),
])
def test_a_100_mb_hostfile_is_refused(tmp_path, line, needle):
    """Before: no answer after 150 s (1.5 GB)."""
    if b"%d" in line:  # distinct hosts (a repeated one would be refused at line 2)
        hf = tmp_path / "hosts"
        with open(hf, "wb") as f:
            size, i = 0, 0
            while size < 100_000_000:
                block = b"".join(line % n for n in range(i, i + 10_000))
                f.write(block)
                size, i = size + len(block), i + 10_000
    else:
        hf = write_big(tmp_path / "hosts", line, head=b"localhost slots=2\n")
    rc, err = run_capped("trainrun", "--hostfile", hf, "--dry-run", "x.py", cwd=tmp_path)
    assert_usage_error(rc, err, "trainrun", str(hf), needle)


def test_a_bad_line_early_in_a_huge_hostfile_is_reported_at_once(tmp_path):
    """Before: a 1 M-line hostfile took 10.8 s to report a duplicate on line 2 (all of it read and parsed first)."""
    hf = write_big(tmp_path / "hosts", b"# more hosts\n", size=50_000_000, head=b"h1 slots=2\nh1 slots=2\n")
    rc, err = run_capped("trainrun", "--hostfile", hf, "--dry-run", "x.py", cwd=tmp_path)
    assert_usage_error(rc, err, "trainrun", f"{hf}:2: host 'h1' is listed twice (first at {hf}:1)")


# YAML configs

BOMB = ("hosts: [&a [h, h, h, h, h, h, h, h, h], &b [*a, *a, *a, *a, *a, *a, *a, *a, *a], "
        "&c [*b, *b, *b, *b, *b, *b, *b, *b, *b], &d [*c, *c, *c, *c, *c, *c, *c, *c, *c], "
        "&e [*d, *d, *d, *d, *d, *d, *d, *d, *d], &f [*e, *e, *e, *e, *e, *e, *e, *e, *e], "
        "&g [*f, *f, *f, *f, *f, *f, *f, *f, *f], &i [*g, *g, *g, *g, *g, *g, *g, *g, *g]]\n")


@pytest.mark.parametrize("command, flag", [("trainrun", "--config"), ("trainrun.horovodrun", "--config-file")])
def test_a_yaml_alias_bomb_is_refused(tmp_path, command, flag):
    """Before: 728 MB and no answer in 30 s (the aliases expanded by str() of the hosts list)."""
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(BOMB if flag == "--config" else BOMB.replace("hosts:", "params:\n  x:"))
    rc, err = run_capped(command, flag, cfg, "-np", 1, "python", "x.py", cwd=tmp_path)
    line = 1 if flag == "--config" else 2
    assert_usage_error(rc, err, command.split(".")[-1], f"{flag} {cfg}:{line}: more than 20000 values")


@pytest.mark.parametrize("text, needle", [
    ("a: &a [x, *a]\n", "an alias inside the value it names"),
    ("np: " + "[" * 500 + "]" * 500 + "\n", "nested more than 64 deep"),
    ("np: 1\n" + "# padding\n" * 120_000, "more than 1 MiB"),
    ("np: 1\nhosts: [" + ", ".join(f"h{i}" for i in range(30_000)) + "]\n", "more than 20000 values"),
])
def test_a_config_past_a_bound_is_one_line(tmp_path, text, needle):
    """A recursive alias or deep nesting was a RecursionError's traceback; size and values had no bound."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(text)
    rc, err = run_capped("trainrun", "--config", cfg, "x.py", cwd=tmp_path)
    assert_usage_error(rc, err, "trainrun", f"--config {cfg}", needle)


@pytest.mark.parametrize("command, flag, text", [
    ("trainrun", "--config", b"np: 2\nprefix: \xff\xfe\n"),
    ("trainrun.horovodrun", "--config-file", b"params:\n  cycle_time_ms: caf\xe9\n"),
])
def test_a_config_that_is_not_utf8_is_one_line(tmp_path, command, flag, text):
    """Before: a UnicodeDecodeError's traceback and exit 1."""
    cfg = tmp_path / "latin1.yaml"
    cfg.write_bytes(text)
    rc, err = run_capped(command, flag, cfg, "-np", 1, "python", "x.py", cwd=tmp_path)
    assert_usage_error(rc, err, command.split(".")[-1], f"{flag} {cfg}:2: not UTF-8 text")


def test_a_config_with_an_alias_within_the_bounds_still_works(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("x: &vars [A=1, B=2]\nhosts: [localhost:1, 127.0.0.1:1]\ndry-run: true\n")
    rc, err = run_capped("trainrun", "--config", cfg, "true", cwd=tmp_path)
    assert rc == 0, err
