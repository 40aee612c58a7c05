import io

from trainrun.supervisor.output import MAX_LINE, OutputSink


def sink(**kw):
    out, err = io.BytesIO(), io.BytesIO()
    return OutputSink(out=out, err=err, **kw), out, err


def test_lines_prefixed_and_partial_kept():
    s, out, err = sink()
    s.feed(0, 1, b"hel")
    s.feed(1, 1, b"other\n")
    s.feed(0, 1, b"lo\nwor")
    assert out.getvalue() == b"[1]<stdout>:other\n[0]<stdout>:hello\n"
    s.feed(0, 1, b"")
    assert out.getvalue().endswith(b"[0]<stdout>:wor\n")
    s.feed(3, 2, b"boom\n")
    assert err.getvalue() == b"[3]<stderr>:boom\n"
    assert s.stderr_tail(3) == ["boom"]


def test_binary_safe_and_no_prefix():
    s, out, _ = sink(prefix="none")
    s.feed(0, 1, b"\x00\xff\n")
    assert out.getvalue() == b"\x00\xff\n"


def test_long_lines_are_cut():
    s, out, _ = sink(prefix="none")
    s.feed(0, 1, b"x" * (MAX_LINE * 2 + 5))
    assert out.getvalue() == b"x" * MAX_LINE + b"\n" + b"x" * MAX_LINE + b"\n"


def test_timestamp_prefix():
    s, out, _ = sink(prefix="timestamp")
    s.feed(2, 1, b"a\n")
    line = out.getvalue().decode()
    assert line.endswith(" [2]<stdout>:a\n") and line[2] == ":"


def test_mpi_prefix_is_open_mpis_tag_output_form():
    """--prefix mpi: the `[1,0]<stdout>:` lines a Horovod user greps for (horovodrun's default here)."""
    s, out, err = sink(prefix="mpi")
    s.feed(1, 1, b"a\n")
    s.feed(0, 2, b"b\n")
    assert out.getvalue() == b"[1,1]<stdout>:a\n" and err.getvalue() == b"[1,0]<stderr>:b\n"
    s, out, _ = sink(prefix="mpi-timestamp")
    s.feed(2, 1, b"c\n")
    line = out.getvalue().decode()
    assert line.endswith(" [1,2]<stdout>:c\n") and line[2] == ":"


def test_output_dir(tmp_path):
    s, _, _ = sink(output_dir=str(tmp_path))
    s.feed(1, 1, b"raw\npart")
    s.feed(1, 2, b"e\n")
    s.close()
    assert (tmp_path / "rank.1" / "stdout").read_bytes() == b"raw\npart"
    assert (tmp_path / "rank.1" / "stderr").read_bytes() == b"e\n"


# ---- terminal controls (a rank's screen clear or window title must not act on the user's terminal)

RAW = b"\x1b[2J\x1b]0;title\x07\x1b[31mred\x1b[0m"


def test_terminal_safe_escapes_controls_but_keeps_colour_tab_and_cr():
    from trainrun.supervisor.output import terminal_safe

    assert terminal_safe(RAW) == b"\\x1b[2J\\x1b]0;title\\x07\x1b[31mred\x1b[0m"
    assert terminal_safe(b"\x1b[1;38;5;208mbold\x1b[m\tcol\rbar\n") == b"\x1b[1;38;5;208mbold\x1b[m\tcol\rbar\n"
    assert terminal_safe(b"\x1b[H\x1b[?1049h\x1bP+q\x1b\\\x08\x00") == b"\\x1b[H\\x1b[?1049h\\x1bP+q\\x1b\\\\x08\\x00"


def test_terminal_safe_c1_controls_escaped_utf8_text_kept():
    from trainrun.supervisor.output import terminal_safe

    # U+009B is a CSI to a terminal; é, €, £ and ° hold bytes 0x80-0x9f or 0xc2 as parts of characters
    text = "é € £ 25° ok".encode()
    assert terminal_safe(text) == text
    assert terminal_safe("a\u009b2Jb\u0085".encode()) == b"a\\x9b2Jb\\x85"


def test_terminal_safe_fast_path_returns_the_same_object():
    from trainrun.supervisor.output import terminal_safe

    data = b"[0]<stdout>:plain text line\n" * 10
    assert terminal_safe(data) is data


def test_sink_escapes_on_a_terminal_even_with_sequences_split_across_chunks():
    """Chunks cut inside an SGR and inside an OSC: whole lines are escaped, so the colour survives and the
    title does not; stderr's tail (the failure summary) is escaped too."""
    s, out, err = sink(escape=True)
    for chunk in (b"\x1b[3", b"1mred\x1b[0m \x1b]0;ti", b"tle\x07 \x1b", b"[2J\n"):
        s.feed(0, 1, chunk)
    assert out.getvalue() == b"[0]<stdout>:\x1b[31mred\x1b[0m \\x1b]0;title\\x07 \\x1b[2J\n"
    s.feed(1, 2, b"oops \x1b]0;x\x07\n")
    assert err.getvalue() == b"[1]<stderr>:oops \\x1b]0;x\\x07\n"
    assert s.stderr_tail(1) == ["oops \\x1b]0;x\\x07"]


def test_sink_escapes_folded_lines_on_a_terminal():
    from trainrun.supervisor.fold import Folder

    s, out, _ = sink(escape=True, folder=Folder([0, 1]), clock=lambda: 0.0)
    s.feed(0, 1, b"\x1b[2Jsame\n")
    s.feed(1, 1, b"\x1b[2Jsame\n")
    s.flush_all()
    assert out.getvalue() == b"[0,1]<stdout>:\\x1b[2Jsame\n"


def test_sink_keeps_the_bytes_off_a_terminal_and_in_files(tmp_path):
    """Not a terminal (BytesIO has no tty): the bytes as written; --output-dir's file: as written either way."""
    s, out, _ = sink(output_dir=str(tmp_path))
    s.feed(0, 1, RAW + b"\n")
    assert out.getvalue() == b"[0]<stdout>:" + RAW + b"\n"
    t, out2, _ = sink(escape=True, output_dir=str(tmp_path / "tty"))
    t.feed(0, 1, RAW + b"\n")
    t.close()
    assert (tmp_path / "tty" / "rank.0" / "stdout").read_bytes() == RAW + b"\n"
    assert b"\x1b[2J" not in out2.getvalue()
