"""Rank output as the launcher prints it: prefixes, whole lines under a burst, partial and binary lines, files."""
import re
import sys

import pytest
from launch_helpers import worker

pytestmark = pytest.mark.timeout(60)

PRINT_RANK = "import os, sys; print('out', os.environ['RANK']); print('err', os.environ['RANK'], file=sys.stderr)"


def test_rank_prefix_default(run_trainrun):
    run = run_trainrun("-np", 2, sys.executable, "-c", PRINT_RANK)
    assert run.rc == 0, run.stderr
    assert sorted(run.stdout.splitlines()) == ["[0]<stdout>:out 0", "[1]<stdout>:out 1"]
    # rank stderr goes to the launcher's stderr, with the stream in the prefix
    assert sorted(run.stderr.splitlines()) == ["[0]<stderr>:err 0", "[1]<stderr>:err 1"]


def test_prefix_none(run_trainrun):
    run = run_trainrun("-np", 2, "--prefix", "none", sys.executable, "-c", PRINT_RANK)
    assert run.rc == 0, run.stderr
    assert sorted(run.stdout.splitlines()) == ["out 0", "out 1"]
    assert sorted(run.stderr.splitlines()) == ["err 0", "err 1"]


def test_prefix_timestamp(run_trainrun):
    run = run_trainrun("-np", 2, "--prefix", "timestamp", sys.executable, "-c", PRINT_RANK)
    assert run.rc == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3} \[[01]\]<stdout>:out [01]", line), line
    for line in run.stderr.splitlines():
        assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3} \[[01]\]<stderr>:err [01]", line), line


def test_prefix_bad_value(run_trainrun):
    run = run_trainrun("-np", 1, "--prefix", "fancy", "true")
    assert run.rc == 2 and "Traceback" not in run.stderr
    assert "--prefix" in run.stderr


def test_concurrent_burst_lines_stay_whole(run_trainrun):
    """4 ranks x 2000 lines at full speed: every line arrives once, complete, prefixed, in rank order."""
    n, np_ = 2000, 4
    run = run_trainrun("-np", np_, worker("burst.py"), n, timeout=40)
    assert run.rc == 0, run.stderr
    pat = re.compile(r"\[(\d)\]<stdout>:rank=(\d) i=(\d+) x{97} end")
    next_index = {r: 0 for r in range(np_)}
    lines = run.stdout.split("\n")
    assert lines[-1] == "", "output must end with a newline"
    for line in lines[:-1]:
        m = pat.fullmatch(line)
        assert m, f"mangled line: {line[:200]!r}"
        prefix_rank, rank, i = int(m[1]), int(m[2]), int(m[3])
        assert prefix_rank == rank, f"line of rank {rank} prefixed as rank {prefix_rank}"
        assert i == next_index[rank], f"rank {rank}: line {i} where {next_index[rank]} was expected"
        next_index[rank] += 1
    assert next_index == {r: n for r in range(np_)}


def test_split_partial_binary_lines(run_trainrun):
    run = run_trainrun("-np", 1, worker("output_kinds.py"))
    assert run.rc == 0, run.stderr
    assert run.out == (
        b"[0]<stdout>:first half second half\n"   # written in two pieces, printed as one line
        b"[0]<stdout>:bin:\x00\xff\xfe\x80 done\n"  # bytes passed through as they are
        b"[0]<stdout>:no newline at the end\n"     # the partial last line is kept (newline added)
    )
    assert run.err == b"[0]<stderr>:to stderr\n"


def test_partial_last_line_prefix_none(run_trainrun):
    run = run_trainrun("-np", 1, "--prefix", "none", sys.executable, "-c", "import sys; sys.stdout.write('a\\nlast')")
    assert run.rc == 0, run.stderr
    assert run.out == b"a\nlast\n"


def test_output_of_failing_rank_is_kept(run_trainrun):
    run = run_trainrun("-np", 1, sys.executable, "-c", "import sys; print('before exit', flush=True); sys.exit(4)")
    assert run.rc == 4
    assert "[0]<stdout>:before exit" in run.stdout.splitlines()


def test_output_dir_files(run_trainrun, tmp_path):
    out = tmp_path / "logs"
    run = run_trainrun("-np", 2, "--output-dir", out, worker("output_kinds.py"))
    assert run.rc == 0, run.stderr
    for r in (0, 1):
        d = out / f"rank.{r}"
        # the files hold the rank's raw bytes: no prefix, no added newline
        assert (d / "stdout").read_bytes() == b"first half second half\nbin:\x00\xff\xfe\x80 done\nno newline at the end"
        assert (d / "stderr").read_bytes() == b"to stderr\n"
    # and the terminal output is still there
    assert run.stdout.count("[0]<stdout>:first half second half") == 1
    assert run.stdout.count("[1]<stdout>:first half second half") == 1


def test_output_dir_with_burst_is_complete(run_trainrun, tmp_path):
    out = tmp_path / "logs"
    run = run_trainrun("-np", 2, "--prefix", "none", "--output-dir", out, worker("burst.py"), 500)
    assert run.rc == 0, run.stderr
    for r in (0, 1):
        lines = (out / f"rank.{r}" / "stdout").read_text().splitlines()
        assert lines == [f"rank={r} i={i} {'x' * 97} end" for i in range(500)]


def test_output_dir_that_cannot_be_created(run_trainrun, tmp_path):
    """A bad --output-dir is a usage error before any rank starts, not a traceback mid-job."""
    afile = tmp_path / "afile"
    afile.write_text("")
    marker = tmp_path / "created"
    run = run_trainrun("-np", 1, "--output-dir", afile, worker("touch.py"), marker)
    assert "Traceback" not in run.stderr, run.stderr
    assert run.rc == 2, run.stderr
    assert str(afile) in run.stderr and "--output-dir" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not marker.exists(), "ranks must not start when their output cannot be written"


def test_long_line_is_cut_into_bounded_pieces(run_trainrun):
    """output.py: lines longer than MAX_LINE (64 KiB) are cut into pieces; nothing is lost. The line comes
    in two writes (64 KiB, then the rest with its newline), so the launcher sees it in two chunks."""
    max_line = 1 << 16
    code = ("import sys, time; o = sys.stdout.buffer; o.write(b'a' * 65536); o.flush(); time.sleep(0.3); "
            "o.write(b'b' * 10 + b'\\n' + b'c' * 200000 + b'\\nafter\\n'); o.flush()")
    run = run_trainrun("-np", 1, "--prefix", "none", sys.executable, "-c", code)
    assert run.rc == 0, run.stderr
    pieces = run.stdout.splitlines()
    assert pieces[-1] == "after"
    assert "".join(pieces[:-1]) == "a" * 65536 + "b" * 10 + "c" * 200000
    assert max(map(len, pieces)) <= max_line, [len(p) for p in pieces]


# ---- terminal controls from a rank: escaped on a terminal, as written in files and through pipes

RAW = b"\x1b[2J\x1b]0;title\x07\x1b[31mred\x1b[0m"
PRINT_RAW = ("import sys; o = sys.stdout.buffer; o.write(b'\\x1b[2J\\x1b]0;title\\x07\\x1b[31mred\\x1b[0m\\n'); o.flush(); "
             "sys.stderr.buffer.write(b'boom \\x1b]0;pwned\\x07\\n'); sys.exit(3)")


def _under_a_terminal(argv, cwd, timeout: float = 30) -> tuple[int, bytes]:
    """Run argv with stdout and stderr on a pseudo-terminal; (exit code, every byte the terminal got)."""
    import os
    import pty
    import select
    import subprocess
    import time

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, cwd=cwd, start_new_session=True)
    os.close(slave)
    got, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not data:
                    break
                got += data
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=max(deadline - time.monotonic(), 1)), got
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        os.close(master)


def test_terminal_controls_are_escaped_on_a_terminal_but_kept_in_files(tmp_path):
    """On a terminal: the rank's screen clear and window title (stdout, and stderr's line in the failure
    summary too) arrive as visible text, its colour as colour. --output-dir's files: the raw bytes."""
    logs = tmp_path / "logs"  # (the argv written out: `from conftest import` finds tests/docker's in a full run)
    argv = [sys.executable, "-m", "trainrun", "-np", "1", "--output-dir", str(logs), sys.executable, "-c", PRINT_RAW]
    code, screen = _under_a_terminal(argv, tmp_path)
    assert code == 3, screen
    assert b"[0]<stdout>:\\x1b[2J\\x1b]0;title\\x07\x1b[31mred\x1b[0m" in screen, screen
    assert b"\x1b[2J" not in screen and b"\x1b]0;" not in screen, screen  # nothing the terminal would act on
    assert b"boom \\x1b]0;pwned\\x07" in screen, screen
    assert (logs / "rank.0" / "stdout").read_bytes() == RAW + b"\n"
    assert (logs / "rank.0" / "stderr").read_bytes() == b"boom \x1b]0;pwned\x07\n"


def test_terminal_controls_pass_through_a_pipe_as_written(run_trainrun):
    """A pipe (or a file) is the user's own redirect: they get the rank's bytes."""
    run = run_trainrun("-np", 1, sys.executable, "-c", PRINT_RAW)
    assert run.rc == 3
    assert run.out == b"[0]<stdout>:" + RAW + b"\n"
    assert b"[0]<stderr>:boom \x1b]0;pwned\x07\n" in run.err
