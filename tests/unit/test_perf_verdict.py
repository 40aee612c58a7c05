"""--check --perf's pure parts: round-robin pairing, outliers against the median, advice, the heat map, the
sameness table, GPU state parsing, and --exclude in the planner."""
from itertools import combinations

import pytest

from trainrun.check.perf_render import perf_json, render_perf
from trainrun.check.perf_verdict import (
    HostSample,
    LinkSample,
    PerfResult,
    collective_prediction,
    degraded,
    exclude_advice,
    findings,
    prediction_nic,
    round_robin,
    suspect_pairs,
)
from trainrun.config import parse_config
from trainrun.errors import UsageError
from trainrun.plan.facts import HostFacts
from trainrun.net.linkbench import parse_gpu_state
from trainrun.plan.hosts import HostSpec, apply_exclude, parse_exclude
from trainrun.plan.planner import assign, shape_job


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 16])
def test_round_robin_covers_every_pair_once_in_disjoint_rounds(n):
    hosts = [f"h{i}" for i in range(n)]
    rounds = round_robin(hosts)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen = [frozenset(p) for r in rounds for p in r]
    assert sorted(map(sorted, seen)) == sorted(map(sorted, map(frozenset, combinations(hosts, 2))))
    for r in rounds:
        busy = [h for p in r for h in p]
        assert len(busy) == len(set(busy)) and len(r) == n // 2


def matrix(hosts, nic="eth1", fast=5000.0, slow_host=None, slow_pair=None, slow=40.0):
    out = []
    for a in hosts:
        for b in hosts:
            if a != b:
                bad = slow_host in (a, b) or (slow_pair and {a, b} == set(slow_pair))
                out.append(LinkSample(nic, a, b, slow if bad else fast * (1 + 0.1 * ((hash(a + b) % 5) - 2) / 2), 30.0))
    return out


def result(hosts, links=(), samples=(), versions=None):
    return PerfResult(list(hosts), ["eth1"], list(links), list(samples), versions or {})


def test_a_slow_host_is_named_once_with_its_nic_and_the_exclude_advice():
    hosts = ["h1", "h2", "h3", "h4"]
    r = result(hosts, matrix(hosts, slow_host="h2"))
    found = findings(r)
    assert [(f.kind, f.subject) for f in found] == [("link", "h2 eth1")]
    assert "1% of the others'" in found[0].message and found[0].exclude == ("h2",)
    assert degraded(found) and exclude_advice(found) == "--exclude h2"
    assert ("eth1", "h1", "h2") in suspect_pairs(r.links, ["eth1"], hosts)


def test_a_single_slow_link_blames_the_path_not_a_host():
    hosts = ["h1", "h2", "h3", "h4", "h5"]
    found = findings(result(hosts, matrix(hosts, slow_pair=("h1", "h3"))))
    assert [(f.kind, f.subject) for f in found] == [("link", "h1<->h3 eth1")]
    assert found[0].exclude == () and "cable" in found[0].advice


def test_healthy_spread_and_two_hosts_raise_nothing():
    hosts = ["h1", "h2", "h3", "h4"]
    links = [LinkSample("eth1", a, b, v) for (a, b), v in zip(
        [(a, b) for a in hosts for b in hosts if a != b], [3000, 5000, 2600, 4000, 6000, 3300] * 2)]
    assert findings(result(hosts, links)) == []
    assert findings(result(["h1", "h2"], [LinkSample("eth1", "h1", "h2", 40.0), LinkSample("eth1", "h2", "h1", 5000.0)])) == []


def test_a_failed_link_is_a_finding():
    hosts = ["h1", "h2", "h3"]
    links = matrix(hosts)
    links[0] = LinkSample("eth1", links[0].src, links[0].dst, None, error="timed out")
    assert any("measurement failed (timed out)" in f.message for f in findings(result(hosts, links)))


def test_slow_compute_and_busy_gpu_are_named():
    samples = [HostSample("h1", 30.0), HostSample("h2", 31.0), HostSample("h3", 12.0, load1=3.0, cpus=2),
               HostSample("h4", 29.0, gpus=({"index": 1, "name": "A", "mem_free_mib": 10, "mem_total_mib": 80, "procs": 2},))]
    found = findings(result(["h1", "h2", "h3", "h4"], samples=samples))
    assert [(f.kind, f.subject) for f in found] == [("compute", "h3"), ("gpu", "h4:1")]
    assert "--exclude h4:1" in found[1].advice and exclude_advice(found) == "--exclude h3"
    ok = [HostSample("h1", 30.0), HostSample("h2", 22.0), HostSample("h3", 26.0)]  # 22 is 76% of 29: not named
    assert findings(result(["h1", "h2", "h3"], samples=ok)) == []


def test_version_mismatch_names_the_odd_host_and_clock_skew_only_warns():
    versions = {"Python": {"h1": "3.11.7", "h2": "3.11.7", "h3": "3.11.2"}, "numpy": {"h1": "2.0", "h2": "2.0", "h3": "2.0"}}
    samples = [HostSample("h1", 30.0, clock_offset_ms=0.1, clock_error_ms=0.2),
               HostSample("h2", 30.0, clock_offset_ms=900.0, clock_error_ms=1.0), HostSample("h3", 30.0)]
    found = findings(result(["h1", "h2", "h3"], samples=samples, versions=versions))
    assert [(f.kind, f.subject, f.degrades) for f in found] == [("version", "Python", True), ("clock", "h2", False)]
    assert "h3: 3.11.2" in found[0].message and "--exclude h3" in found[0].advice


def test_heat_map_marks_the_slow_row_with_and_without_colour():
    hosts = ["h1", "h2", "h3", "h4"]
    r = result(hosts, matrix(hosts, slow_host="h2"), versions={"Python": {h: "3.11.7" for h in hosts}})
    text = render_perf(r, findings(r), color=False)
    row = next(line for line in text if line.startswith("  h2 ") and "!" in line)
    assert row.split()[1:] == ["40!", "-", "40!", "40!"]
    assert not any("\033[" in line for line in text)
    assert text[-1] == "perf verdict: DEGRADED, 1 finding(s); to run without them: --exclude h2"
    coloured = render_perf(r, findings(r), color=True)
    assert any("\033[31m40" in line for line in coloured) and not any("40!" in line for line in coloured)
    doc = perf_json(r, findings(r))
    assert doc["degraded"] and doc["exclude"] == "--exclude h2"
    assert doc["links"]["eth1"]["matrix"][1] == [40.0, None, 40.0, 40.0]


def test_parse_gpu_state_counts_the_processes_per_gpu():
    gpus = "0, GPU-a, NVIDIA H100, 1000, 81559\n1, GPU-b, NVIDIA H100, 81000, 81559\n"
    apps = "GPU-a, 123\nGPU-a, 456\n"
    assert [(g["index"], g["mem_free_mib"], g["procs"]) for g in parse_gpu_state(gpus, apps)] == [(0, 1000, 2), (1, 81000, 0)]


def test_exclude_hosts_and_gpus():
    specs = [HostSpec("h1", 2), HostSpec("h2", 2), HostSpec("h3", 2)]
    excl = parse_exclude("h2,h3:1")
    assert [h.name for h in apply_exclude(specs, excl)] == ["h1", "h3"] and excl.gpus_of("h3") == {1}
    with pytest.raises(UsageError, match="--exclude h9: not among the job's hosts"):
        apply_exclude(specs, parse_exclude("h9"))
    with pytest.raises(UsageError, match="leaves no host"):
        apply_exclude(specs, parse_exclude("h1,h2,h3"))
    with pytest.raises(UsageError, match="expected HOST or HOST:GPU"):
        parse_config(("x",), hosts="h1", exclude="h1:gpu0")
    from trainrun.launchspec import resolve

    spec = resolve(parse_config(("x",), hosts="h1:2,h2:2", exclude="h2,h1:0"), {})
    assert [h.name for h in spec.hosts.hosts] == ["h1"]
    facts = {"h1": HostFacts("h1", 4, "python", "0", gpus=(0, 1, 2))}
    assert [a.gpus for a in assign(spec.plan, shape_job(spec.plan, spec.hosts.hosts), facts)] == [(1,), (2,)]


def test_perf_flags_need_check():
    with pytest.raises(UsageError, match="--perf goes with --check"):
        parse_config(("x",), hosts="h1", perf=True)
    with pytest.raises(UsageError, match="go with --perf"):
        parse_config((), hosts="h1", check=True, perf_strict=True)
    assert parse_config((), hosts="h1", check=True, perf=True, perf_time=30.0).perf_time == 30.0


def test_link_seconds_follow_the_budget():
    from trainrun.check.perf import DEFAULT_SECONDS, link_seconds

    assert link_seconds(None, 3, 2, 4) == DEFAULT_SECONDS
    assert link_seconds(1000.0, 3, 2, 4) == 3.0 and link_seconds(5.0, 15, 2, 16) == 0.1
    assert 0.1 < link_seconds(40.0, 3, 2, 4) < 3.0
    s = link_seconds(26.0, 1, 2, 2, collective=False)  # one round: it must fit what the skip rule allows
    assert 2 * (2 * s + 0.3) <= 26.0 - 3.0 - 1.2


def test_versions_table_reads_the_facts():
    from trainrun.check.perf import versions_table

    f = {h: HostFacts(h, 1, "p", "0.1", python_version=v, numpy="2.0") for h, v in (("a", "3.11.7"), ("b", "3.11.2"))}
    t = versions_table(f)
    assert t["Python"] == {"a": "3.11.7", "b": "3.11.2"} and t["numpy"] == {"a": "2.0", "b": "2.0"}


def test_the_collective_is_compared_with_the_nic_its_launch_names_first():
    """--network-interface eth1 makes eth1 the collective's NIC, though eth0 sorts first among those measured."""
    hosts = ["h1", "h2", "h3"]
    links = matrix(hosts, "eth0", fast=5000.0) + matrix(hosts, "eth1", slow_host="h2")
    r = PerfResult(hosts, ["eth0", "eth1"], links)
    assert collective_prediction(r) > 2000 and prediction_nic(r) == "eth0"
    r = PerfResult(hosts, ["eth0", "eth1"], links, collective_nic="eth1")
    assert collective_prediction(r) == 40.0 and prediction_nic(r) == "eth1"
    assert perf_json(r, [])["collective"]["predicted_nic"] == "eth1"


def test_every_link_of_a_host_under_the_host_rule_is_measured_again():
    """h3's median is under half the reference though its link to h1 is above the line on its own: the
    verdict would name h3, so all three of its pairs are re-measured, h3's first."""
    hosts = ["h1", "h2", "h3", "h4"]
    slow = {frozenset(("h1", "h3")): 2800.0, frozenset(("h2", "h3")): 2000.0, frozenset(("h3", "h4")): 2200.0}
    links = [LinkSample("eth1", a, b, slow.get(frozenset((a, b)), 5000.0)) for a in hosts for b in hosts if a != b]
    assert [(f.kind, f.subject) for f in findings(result(hosts, links))] == [("link", "h3 eth1")]
    pairs = {frozenset(p[1:]) for p in suspect_pairs(links, ["eth1"], hosts)}
    assert pairs == set(slow)


class FakeBench:
    """A host's linkbench as measure_links drives it: `mbps(a, b, n)` is the n-th reading (from 1) of a -> b."""

    def __init__(self, host, mbps, calls):
        self.host, self.mbps, self.calls = host, mbps, calls

    def address(self, nic):
        return ("10.0.0.1", 1)

    def call(self, op):
        key = frozenset((self.host, op["peer"]))
        self.calls[key] = self.calls.get(key, 0) + 1
        n = self.calls[key]
        return {"rtt_us": 30.0, "tx_mbps": self.mbps(self.host, op["peer"], n), "rx_mbps": self.mbps(op["peer"], self.host, n)}


def measure(mbps, hosts=("h1", "h2", "h3", "h4")):
    from trainrun.check.perf import measure_links

    calls = {}
    benches = {h: FakeBench(h, mbps, calls) for h in hosts}
    links = measure_links(benches, round_robin(list(hosts)), ["eth1"], 0.1, None, lambda text: None, [])
    return links, calls


def test_a_link_slow_through_two_retests_is_cleared_by_a_later_sweep():
    """h2<->h3 reads 30% of the others in its round and the next two readings (a load burst), then like
    the others: not a slow link. Two back-to-back retests (the old rule) named it."""
    def mbps(a, b, n):
        return 1500.0 if {a, b} == {"h2", "h3"} and n <= 3 else 5000.0

    links, calls = measure(mbps)
    assert findings(result(["h1", "h2", "h3", "h4"], links)) == []
    assert calls[frozenset(("h2", "h3"))] == 4
    s = next(s for s in links if (s.src, s.dst) == ("h2", "h3"))
    assert s.mbps == 5000.0 and s.readings == (1500.0, 1500.0, 1500.0, 5000.0)


def test_a_throttled_host_stays_named_through_every_sweep():
    def mbps(a, b, n):
        return 40.0 if "h2" in (a, b) else 5000.0

    links, calls = measure(mbps)
    found = findings(result(["h1", "h2", "h3", "h4"], links))
    assert [(f.kind, f.subject) for f in found] == [("link", "h2 eth1")]
    from trainrun.check.perf import RETESTS
    assert all(calls[frozenset(("h2", h))] == 1 + RETESTS for h in ("h1", "h3", "h4"))
    assert all(calls[frozenset(p)] == 1 for p in (("h1", "h3"), ("h1", "h4"), ("h3", "h4")))
