"""The example hostfiles shipped in hostfiles/ parse to what their comments say."""
from pathlib import Path

from trainrun.plan.hosts import HostSpec, read_hostfile

DIR = Path(__file__).parents[2] / "hostfiles"


def test_examples():
    assert read_hostfile(str(DIR / "local.txt")) == [HostSpec("localhost", 2)]
    assert read_hostfile(str(DIR / "local-two-nodes.txt")) == [HostSpec("localhost", 2), HostSpec("127.0.0.1", 2)]
    assert read_hostfile(str(DIR / "cluster-example.txt")) == [
        HostSpec("node1", 4), HostSpec("node2", 4), HostSpec("node3", 4, "root"), HostSpec("node4", 1)]
    assert [h.name for h in read_hostfile(str(DIR / "testbed.txt"))] == ["h1", "h2", "h3"]
