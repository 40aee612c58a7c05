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
