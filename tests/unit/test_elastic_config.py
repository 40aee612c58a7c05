"""The elastic options as LaunchConfig sees them: defaults, usage errors with one-line messages."""
import pytest

from trainrun.config import parse_config
from trainrun.errors import UsageError


def cfg(**kw):
    return parse_config(("train.py",), **kw)


def given_hosts(config):
    """The hosts the launch step resolves (launchspec.host_request: a discovery script runs there, once)."""
    from trainrun.launchspec import host_request

    return host_request(config).given


def test_max_restarts_defaults_to_0_and_to_unlimited_with_elastic_sizing():
    assert not cfg(num_proc=2).elastic_settings().enabled
    assert cfg(num_proc=2, max_restarts=3).elastic_settings().max_restarts == 3
    s = cfg(hosts="h1:2,h2:2", min_np=2).elastic_settings()
    assert s.sizing and s.max_restarts is None and s.min_np == 2
    assert cfg(hosts="h1:2,h2:2", min_np=2, max_restarts=1).elastic_settings().max_restarts == 1


@pytest.mark.parametrize("kw, message", [
    (dict(num_proc=4, min_np=6), "--min-np 6 is more than -np 4"),
    (dict(num_proc=4, max_np=2), "--max-np 2 is less than -np 4"),
    (dict(num_proc=4, min_np=3, max_np=2), "--min-np 3 is more than --max-np 2"),
    (dict(hosts="h1:2", host_discovery_script="./d.sh"), "--host-discovery-script and -H/--hostfile both given"),
    (dict(num_proc=2, max_restarts=1, mpi="openmpi"), "--mpi openmpi cannot restart or resize a job"),
    (dict(num_proc=2, min_np=1, blacklist_cooldown_range=(5.0, 1.0)), "--blacklist-cooldown-range 5 1"),
])
def test_bad_elastic_options_are_usage_errors(kw, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace("/", "/")):
        cfg(**kw)


def test_a_discovery_script_replaces_hosts_and_np(tmp_path):
    script = tmp_path / "d.sh"
    script.write_text("#!/bin/sh\necho h1:2\necho h2\n")
    script.chmod(0o755)
    hosts = given_hosts(cfg(host_discovery_script=str(script)))
    assert [(h.name, h.slots) for h in hosts] == [("h1", 2), ("h2", 1)]


def test_a_failing_discovery_script_is_a_usage_error(tmp_path):
    script = tmp_path / "d.sh"
    script.write_text("#!/bin/sh\necho no inventory >&2\nexit 4\n")
    script.chmod(0o755)
    with pytest.raises(UsageError, match="exited with code 4 \\(no inventory\\)"):
        given_hosts(cfg(host_discovery_script=str(script)))
    with pytest.raises(UsageError, match="cannot run it"):
        given_hosts(cfg(host_discovery_script=str(tmp_path / "missing.sh")))


def test_a_discovery_script_that_never_stops_printing_is_read_within_bounds(tmp_path):
    """Its answer is a hostfile: past MAX_HOSTFILE_BYTES it is killed and named, memory stays small."""
    script = tmp_path / "d.sh"
    script.write_text("#!/bin/sh\nexec yes h1:2\n")
    script.chmod(0o755)
    with pytest.raises(UsageError, match=r"d.sh: printed more than 4 MiB; it must print the hosts available now"):
        given_hosts(cfg(host_discovery_script=str(script)))
    quiet = tmp_path / "q.sh"  # its output closed, but it runs on: no answer, and it is killed
    quiet.write_text("#!/bin/sh\necho h1:2\nexec >&- 2>&-\nsleep 600\n")
    quiet.chmod(0o755)
    import trainrun.elasticjob.discovery as discovery

    old, discovery.SCRIPT_TIMEOUT = discovery.SCRIPT_TIMEOUT, 1.0
    try:
        with pytest.raises(UsageError, match="no answer within 1s"):
            given_hosts(cfg(host_discovery_script=str(quiet)))
    finally:
        discovery.SCRIPT_TIMEOUT = old


def test_max_backoff_defaults_and_is_shown():
    from trainrun.config import LaunchConfig
    from trainrun.elasticjob.policy import DEFAULT_MAX_BACKOFF

    assert LaunchConfig(command=("x",)).max_backoff == DEFAULT_MAX_BACKOFF == 10.0  # the two copies agree
    s = cfg(num_proc=2, max_restarts=3).elastic_settings()
    assert s.max_backoff == 10.0 and "back-off 0.5 s doubling up to 10 s" in s.describe()
    s = cfg(num_proc=2, max_restarts=3, max_backoff=4.0).elastic_settings()
    assert s.max_backoff == 4.0 and s.to_json()["max_backoff"] == 4.0 and "up to 4 s" in s.describe()
    assert ", back-off 0.2 s," in cfg(num_proc=2, max_restarts=1, max_backoff=0.2).elastic_settings().describe()
    assert ", no back-off," in cfg(num_proc=2, max_restarts=1, max_backoff=0).elastic_settings().describe()


def test_warm_ranks_are_on_by_default_and_shown():
    on = cfg(num_proc=2, max_restarts=1).elastic_settings()
    off = cfg(num_proc=2, max_restarts=1, warm_ranks=False).elastic_settings()
    assert on.warm_ranks and on.to_json()["warm_ranks"] is True and "warm ranks (a spare per rank)" in on.describe()
    assert not off.warm_ranks and off.describe().endswith("no warm ranks")
