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
