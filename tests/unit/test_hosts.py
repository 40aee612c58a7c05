import pytest

from trainrun.errors import UsageError
from trainrun.plan.hosts import HostSpec, is_local_name, parse_hostfile_text, parse_hosts_arg


@pytest.mark.parametrize("text, expected", [
    ("a", [HostSpec("a", 1)]),
    ("a:4", [HostSpec("a", 4)]),
    ("a:2,b:3", [HostSpec("a", 2), HostSpec("b", 3)]),
    ("root@a:2", [HostSpec("a", 2, "root")]),
    ("10.0.0.1:8", [HostSpec("10.0.0.1", 8)]),
    ("[fe80::1]:2", [HostSpec("fe80::1", 2)]),
    ("[::1]", [HostSpec("::1", 1)]),
    (" a:1 , b ", [HostSpec("a", 1), HostSpec("b", 1)]),
])
def test_hosts_arg(text, expected):
    assert parse_hosts_arg(text) == expected


@pytest.mark.parametrize("text, fragment", [
    ("host:", "slots are missing"),
    ("host:x", "'x' is not a positive whole number"),
    (":4", "host name is missing"),
    ("host:-1", "'-1' is not a positive whole number"),
    ("host:0", "at least 1"),
    ("a,,b", "empty host entry"),
    ("a:1,a:2", "listed twice"),
    ("bad host:2", "not a host name"),
])
def test_hosts_arg_errors(text, fragment):
    with pytest.raises(UsageError) as err:
        parse_hosts_arg(text)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_hostfile_formats():
    text = "# cluster\nnode1 slots=4\nnode2:2   # trailing comment\n\nnode3\nuser@node4 slots=1 max_slots=8\n"
    assert parse_hostfile_text(text, "hf") == [
        HostSpec("node1", 4), HostSpec("node2", 2), HostSpec("node3", 1), HostSpec("node4", 1, "user"),
    ]


@pytest.mark.parametrize("text, fragment", [
    ("a slots=0", "hf:1: slots must be at least 1 in 'a slots=0'"),
    ("a\nb slots=x", "hf:2: slots 'x' is not a positive whole number in 'b slots=x'"),
    ("a\n\nb foo=1", "hf:3: unknown key 'foo'"),
    ("a slots", "hf:1: 'slots' is not key=value"),
    ("a:2 slots=2", "either 'host:N' or 'host slots=N'"),
    ("a\na slots=2", "hf:2: host 'a' is listed twice (first at hf:1)"),
    ("# only comments\n\n", "hf: no hosts in hostfile"),
])
def test_hostfile_errors(text, fragment):
    with pytest.raises(UsageError) as err:
        parse_hostfile_text(text, "hf")
    assert fragment in str(err.value)


@pytest.mark.parametrize("name, local", [
    ("localhost", True), ("127.0.0.1", True), ("127.3.4.5", True), ("::1", True),
    ("no-such-host", False), ("192.0.2.7", False),
])
def test_is_local(name, local):
    assert is_local_name(name) is local


def test_own_hostname_is_local():
    import socket

    assert is_local_name(socket.gethostname())


def test_one_host_under_two_logins_is_a_usage_error():
    """A host is its name (one agent, one set of local ranks): alice@h1 and bob@h1 are not two hosts."""
    with pytest.raises(UsageError, match=r"host 'h1' is listed twice, as 'alice@h1' .* and as 'bob@h1'"):
        parse_hosts_arg("alice@h1:1,bob@h1:1")
    with pytest.raises(UsageError, match=r"f:2: host 'h1' is listed twice"):
        parse_hostfile_text("alice@h1 slots=1\nbob@h1 slots=1\n", "f")


@pytest.mark.parametrize("text, fragment", [
    ("a..b:2", "'a..b' is not a valid host name: an empty label"),
    (".a", "'.a' is not a valid host name: an empty label"),
    ("a" * 64 + ":2", "is 64 characters (at most 63)"),
    (".".join(["a" * 60] * 5), "(304 characters; at most 253)"),
    ("-a:1", "label '-a' starts or ends with '-'"),
    ("node-:1", "label 'node-' starts or ends with '-'"),
    ("10.0.0.256:2", "'10.0.0.256' is not a valid IPv4 address"),
    ("1.2.3:2", "'1.2.3' is not a valid IPv4 address"),
    ("[fe80::1::2]:2", "'[fe80::1::2]' is not an IPv6 address"),
    ("user@a..b", "'a..b' is not a valid host name"),
])
def test_host_names_are_checked_as_dns_names_or_addresses(text, fragment):
    """Before: these reached the resolver and crashed in the idna codec (a 55-line UnicodeError traceback)."""
    with pytest.raises(UsageError) as err:
        parse_hosts_arg(text)
    assert fragment in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith(f"-H entry '{text}': ")


@pytest.mark.parametrize("name", ["a" * 63, "node_1", "my_service.internal", "h1.example.com.", "n-1.x-2", "1a", "a1.b2.c3"])
def test_valid_names_pass(name):
    assert parse_hosts_arg(f"{name}:2") == [HostSpec(name, 2)]


def test_a_bad_name_in_a_hostfile_names_file_and_line():
    with pytest.raises(UsageError) as err:
        parse_hostfile_text("good slots=2\n\nbad..name slots=2\n", "hf")
    assert str(err.value).startswith("hf:3: 'bad..name' is not a valid host name")


def test_slots_above_the_rank_cap_are_refused(monkeypatch):
    """Before: -H h1:1000000000 planned a billion ranks (memory grew ~100 MB every 5 s)."""
    from trainrun.plan.limits import MAX_RANKS

    with pytest.raises(UsageError, match=f"slots 1000000000 is more than the {MAX_RANKS} ranks a job may have"):
        parse_hosts_arg("h1:1000000000")
    assert parse_hosts_arg(f"h1:{MAX_RANKS}") == [HostSpec("h1", MAX_RANKS)]
    monkeypatch.setenv("TRAINRUN_MAX_RANKS", "100")
    with pytest.raises(UsageError, match="more than the 100 ranks"):
        parse_hostfile_text("h1 slots=101\n", "hf")


def test_hostfile_byte_order_mark_is_skipped(tmp_path):
    from trainrun.plan.hosts import read_hostfile

    path = tmp_path / "hosts"
    path.write_bytes(b"\xef\xbb\xbfnode1 slots=2\nnode2 slots=2\n")
    assert read_hostfile(str(path)) == [HostSpec("node1", 2), HostSpec("node2", 2)]
    assert parse_hostfile_text("\ufeffnode1:2\n", "hf") == [HostSpec("node1", 2)]


# bounded reading (issue 38): a hostfile is parsed while it is read, with a byte and a line-length limit

def test_a_hostfile_without_newlines_is_refused_at_its_first_line(tmp_path):
    """Before: read whole (/dev/zero grew without end)."""
    from trainrun.plan.hosts import MAX_HOSTFILE_LINE, read_hostfile

    with pytest.raises(UsageError, match=f"^/dev/zero:1: line longer than {MAX_HOSTFILE_LINE} bytes"):
        read_hostfile("/dev/zero")
    path = tmp_path / "one-line"
    path.write_bytes(b"h" * (MAX_HOSTFILE_LINE + 10))
    with pytest.raises(UsageError, match=f"^{path}:1: line longer than"):
        read_hostfile(str(path))


def test_a_line_of_exactly_the_limit_is_read(tmp_path):
    from trainrun.plan.hosts import MAX_HOSTFILE_LINE, read_hostfile

    path = tmp_path / "hf"
    padded = "h1 slots=2 #".ljust(MAX_HOSTFILE_LINE, "x")
    path.write_text(f"{padded}\nh2\n")  # the limit is of the line's bytes before its newline
    assert read_hostfile(str(path)) == [HostSpec("h1", 2), HostSpec("h2", 1)]


def test_a_hostfile_over_the_byte_limit_is_refused(tmp_path):
    from trainrun.plan.hosts import MAX_HOSTFILE_BYTES, read_hostfile

    path = tmp_path / "big"
    comment = b"# " + b"x" * 1000 + b"\n"
    path.write_bytes(b"h1 slots=2\n" + comment * (MAX_HOSTFILE_BYTES // len(comment) + 1))
    with pytest.raises(UsageError, match=rf"^--hostfile {path}: more than 4 MiB \(at line \d+\)"):
        read_hostfile(str(path))


class _EndlessHostfile:
    """A file-like hostfile whose lines never end (h1, h1, h2, h3, ...): only a reader that parses each line as
    it reads it ever returns."""

    def __init__(self) -> None:
        self.lines_read = 0

    def readline(self, limit: int = -1) -> bytes:
        self.lines_read += 1
        return b"h1\n" if self.lines_read <= 2 else f"h{self.lines_read}\n".encode()


def test_the_first_bad_line_is_reported_without_reading_the_rest():
    """Before: a 1 M-line hostfile took 10.8 s to report a duplicate on line 2."""
    from trainrun.plan import hosts

    f = _EndlessHostfile()
    with pytest.raises(UsageError, match="^hf:2: host 'h1' is listed twice"):
        hosts._parse_hostfile_lines(hosts._hostfile_lines(f, "hf"), "hf")  # type: ignore[arg-type]
    assert f.lines_read == 2


def test_a_line_that_is_not_utf8_is_named(tmp_path):
    from trainrun.plan.hosts import read_hostfile

    path = tmp_path / "hf"
    path.write_bytes(b"h1\nh\xff2\n")
    with pytest.raises(UsageError, match=f"^{path}:2: not UTF-8 text"):
        read_hostfile(str(path))
    path.write_bytes(b"\xef\xbb\xbfh1 slots=3\r\nh2\n")  # a byte-order mark, CRLF line ends
    assert read_hostfile(str(path)) == [HostSpec("h1", 3), HostSpec("h2", 1)]


def test_no_more_hosts_than_a_job_may_have_ranks(monkeypatch, tmp_path):
    from trainrun.plan.hosts import read_hostfile

    monkeypatch.setenv("TRAINRUN_MAX_RANKS", "3")
    path = tmp_path / "hf"
    path.write_text("a\nb\n# c\nc\nd\ne\n")
    with pytest.raises(UsageError, match=f"^{path}:5: more than 3 hosts"):
        read_hostfile(str(path))
    with pytest.raises(UsageError, match="^-H entry 'd': more than 3 hosts"):
        parse_hosts_arg("a,b,c,d")
    assert len(parse_hosts_arg("a,b,c")) == 3
