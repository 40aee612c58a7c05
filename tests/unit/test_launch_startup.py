"""What a plain local launch does not do (docs/benchmarks/launch.md has the times): read its command line
with click, import shutil, ctypes, statistics, json or ipaddress, or tear the interpreter down at exit. Pinned
by what it imports and does, not by a timed test. The plain form's reading is click's own (compared here), and
the `which` that replaces shutil's finds what shutil.which finds."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from trainrun.cli import simple
from trainrun.cli.command import cli
from trainrun.plan.program import which

PLAIN = [
    ["-np", "2", "prog"],
    ["-np", "2", "prog", "a", "-np", "3", "--help"],  # the program's arguments are its own, options or not
    ["--num-proc", "4", "x.py", "--lr", "0.1"],
    ["-np", "10", "python", "-c", "pass"],
    ["prog"],
    ["train.py", "-H", "h1"],
]
NOT_PLAIN = [
    [], ["-np"], ["-np", "2"], ["--help"], ["-h"], ["--version"], ["--sbatch", "x"], ["-np", "0", "x"],
    ["-np", "+2", "x"], ["-np", " 2", "x"], ["-np", "2.0", "x"], ["-np", "\u00b2", "x"], ["-np", "two", "x"],
    ["-np", "2", "--", "x"], ["--", "x"], ["-np", "2", "-v", "x"], ["-v", "-np", "2", "x"], ["-np=2", "x"],
    ["--num-proc=2", "x"], ["-np2", "x"], ["-H", "h1:2", "x"], ["--dry-run", "x"], ["-np", "2", "-np", "3", "x"],
]


def click_reads(argv: list[str]) -> tuple[tuple[str, ...], dict]:
    ctx = cli.make_context("trainrun", list(argv))
    params = dict(ctx.params)
    command, json_ = params.pop("command"), params.pop("json_")
    assert json_ is False
    return command, params


@pytest.mark.parametrize("argv", PLAIN)
def test_the_plain_form_is_read_as_click_reads_it(argv):
    assert simple.parse(argv) == click_reads(argv)


@pytest.mark.parametrize("argv", NOT_PLAIN)
def test_anything_else_is_left_to_click(argv):
    assert simple.parse(argv) is None


def test_the_defaults_are_the_click_commands(monkeypatch):
    assert click_reads(["prog"])[1] == simple.DEFAULTS
    monkeypatch.setenv(simple.COMPLETE_VAR, "bash_complete")  # click answers shell completion: not a launch
    assert simple.parse(["-np", "2", "prog"]) is None


@pytest.mark.parametrize("name", ["sh", "python3", "ls", "no-such-program-here", "bin", "."])
def test_which_finds_what_shutil_which_finds(name, tmp_path, monkeypatch):
    assert which(name) == shutil.which(name)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / name).mkdir(exist_ok=True)  # a directory of the name comes first: skipped by both
    (tmp_path / "f").mkdir()
    prog = tmp_path / "f" / name
    if name != ".":
        prog.write_text("#!/bin/sh\n")
        prog.chmod(0o644)  # not executable: skipped by both
    for path in (f"{tmp_path}/d:{tmp_path}/f:{os.environ['PATH']}", f"{tmp_path}/f", "", f"::{tmp_path}/d"):
        monkeypatch.setenv("PATH", path)
        assert which(name) == shutil.which(name), path
    if name != ".":
        prog.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}/d:{tmp_path}/f:{tmp_path}/f")
        assert which(name) == shutil.which(name) == str(prog)
    monkeypatch.delenv("PATH")
    assert which(name) == shutil.which(name)


def test_a_plain_local_launch_imports_none_of_these():
    """Nor the click command, nor the straggler watch (no rank sent a window summary)."""
    heavy = ["click", "shutil", "ctypes", "statistics", "json", "ipaddress", "uuid", "trainrun.cli.command",
             "trainrun.supervisor.straggler", "paramiko", "mpi4py", "numpy", "torch", "ray"]
    code = textwrap.dedent(f"""
        import atexit, sys
        atexit.register(lambda: print("imported:", sorted(m for m in {heavy!r} if m in sys.modules), file=sys.stderr))
        from trainrun.cli import main
        main()
    """)
    p = subprocess.run([sys.executable, "-c", code, "-np", "2", sys.executable, "-c", "print('hi')"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["[0]<stdout>:hi", "[1]<stdout>:hi"] or sorted(p.stdout.splitlines()) == [
        "[0]<stdout>:hi", "[1]<stdout>:hi"]
    assert "imported: []" in p.stderr, p.stderr


def test_the_launcher_ends_without_the_interpreters_teardown():
    """exit_now: the exit code, the atexit handlers and the flushed output, and no finalization (an object's
    __del__ that the teardown of its module would run, does not)."""
    code = textwrap.dedent("""
        import atexit, sys
        from trainrun.cli import exit_now

        class Late:
            def __del__(self):
                print("finalized")

        keep = Late()
        atexit.register(print, "atexit ran")
        sys.stdout.write("buffered")
        exit_now(SystemExit(7))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout) == (7, "bufferedatexit ran\n")


@pytest.mark.parametrize("setup, rc, out", [
    ("import threading, time; threading.Thread(target=time.sleep, args=(0.3,)).start()", 3, "finalized\n"),
    ("", 1, "finalized\n"),  # a message, not a number: printed to stderr by the interpreter
])
def test_the_interpreter_ends_it_where_exit_now_cannot(setup, rc, out):
    code = textwrap.dedent(f"""
        import sys
        from trainrun.cli import exit_now

        class Late:
            def __del__(self):
                print("finalized")

        keep = Late()
        {setup}
        exit_now(SystemExit(3 if {bool(setup)} else "bye"))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout) == (rc, out), p.stderr
