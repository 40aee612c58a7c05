"""config.parse_config: the user's option strings become typed values once, where argv and YAML are read
(-H, --hostfile, --exclude, --network-interface, --ranks, -x), and the later layers get only those values."""
import pytest

from trainrun.config import LaunchConfig, parse_config
from trainrun.errors import UsageError
from trainrun.plan.hosts import Exclusion, HostSpec, format_hosts, parse_exclude, parse_hosts_arg


def test_every_user_string_is_a_typed_value_after_parsing(tmp_path):
    cfg = parse_config(("train.py",), hosts="alice@h1:2,h2", exclude="h2,h1:1", network_interface="eth0, eth1",
                       show_ranks="0-2,5", export=("A=1", "B"))
    assert cfg.hosts == (HostSpec("h1", 2, "alice"), HostSpec("h2", 1))
    assert cfg.exclude == Exclusion(frozenset({"h2"}), (("h1", 1),))
    assert cfg.network_interface == ("eth0", "eth1")
    assert cfg.show_ranks == frozenset({0, 1, 2, 5})
    assert cfg.export == (("A", "1"), ("B", None))
    hf = tmp_path / "hosts"
    hf.write_text("n1 slots=2\nn2:3\n")
    cfg = parse_config(("train.py",), hostfile=str(hf))
    assert cfg.hosts == (HostSpec("n1", 2), HostSpec("n2", 3)) and cfg.hostfile == str(hf)
    assert parse_config(("x",), num_proc=1).exclude == Exclusion() and not parse_config(("x",), num_proc=1).exclude


def test_no_field_is_left_a_string_that_a_later_layer_parses():
    """The options that were strings parsed deep inside (issue 26) are typed fields now."""
    types = LaunchConfig.__annotations__
    for name in ("hosts", "exclude", "network_interface", "show_ranks", "export"):
        assert "str |" not in types[name] and types[name] != "str", (name, types[name])


@pytest.mark.parametrize("kw, message", [
    (dict(network_interface="eth0,"), "--network-interface eth0,: '' is not a NIC name"),
    (dict(network_interface="eth0,a/b"), "'a/b' is not a NIC name"),
    (dict(network_interface="averyveryverylongnic"), "is not a NIC name"),
    (dict(show_ranks="x"), "--ranks x: 'x' is not a rank"),
    (dict(show_ranks="3-1"), "the range ends before it starts"),
    (dict(exclude="h1:gpu0"), "--exclude entry 'h1:gpu0': expected HOST or HOST:GPU"),
    (dict(export=("1BAD=2",)), "-x 1BAD=2: '1BAD' is not a variable name"),
    (dict(hosts="h1:0"), "-H entry 'h1:0'"),
    (dict(hosts="h1", hostfile="hf"), "-H and --hostfile both given"),
    (dict(hostfile="/no/such/hostfile"), "--hostfile /no/such/hostfile: no such file"),
])
def test_bad_strings_are_usage_errors_at_parse_time(kw, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        parse_config(("x",), num_proc=1, **kw)


def test_ranks_beyond_the_job_are_checked_when_its_size_is_known():
    from trainrun.launchspec import resolve

    out = resolve(parse_config(("x",), num_proc=4, show_ranks="0,9"), {}).output
    assert out.shown(10) == frozenset({0, 9})
    with pytest.raises(UsageError, match="--ranks 0,9: the job has ranks 0-3, not 9"):
        out.shown(4)


def test_an_unset_export_is_looked_up_in_the_launchers_environment():
    cfg = parse_config(("x",), num_proc=1, export=("A=1", "B"))
    assert {k: v for k, v in cfg.exported_env({"B": "2"}).items() if k in "AB"} == {"A": "1", "B": "2"}
    with pytest.raises(UsageError, match="-x B: not set in the launcher's environment"):
        cfg.exported_env({})


@pytest.mark.parametrize("text", ["h1:2,alice@h2:1", "[::1]:2,[fe80::1]:1,10.0.0.1:3", "h1"])
def test_format_hosts_round_trips(text):
    specs = parse_hosts_arg(text)
    assert parse_hosts_arg(format_hosts(specs)) == specs


@pytest.mark.parametrize("text", ["h7", "h7,h9", "h3:1,h3:2", "h1,h3:0"])
def test_exclusion_prints_as_exclude_takes_it(text):
    excl = parse_exclude(text)
    assert parse_exclude(str(excl)) == excl


def test_the_perf_collective_relaunch_gets_the_same_hosts_and_options(tmp_path):
    """--check --perf relaunches trainrun over the check's hosts: from the parsed values, a hostfile's as -H."""
    from trainrun.check.perf import launch_argv
    from trainrun.launchspec import resolve

    hf = tmp_path / "hosts"
    hf.write_text("h1 slots=2\nalice@h2 slots=2\n")
    cfg = parse_config((), hostfile=str(hf), exclude="h2:1", network_interface="eth1,eth0", check=True, perf=True)
    argv = launch_argv(resolve(cfg, {}), ["prog"])
    opts = dict(zip(argv[3:-1:2], argv[4:-1:2]))
    assert opts["-H"] == "h1:2,alice@h2:2" and opts["--exclude"] == "h2:1" and opts["--network-interface"] == "eth1,eth0"
    assert "--hostfile" not in argv and argv[-1] == "prog"
