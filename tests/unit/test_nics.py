"""routable_nics and the probe's pieces, on literal tables."""
import json
import socket
import threading

import pytest

from trainrun.net.nics import Nic, ProbeResult, RoutableNic, local_nics, probe, probe_targets, routable_nics

H = ["h1", "h2", "h3"]


def nics(host_index, *extra):
    """eth0 10.1.0.x/24, eth1 10.2.0.x/24, docker0 172.17.0.1/16, lo, plus extra NICs."""
    x = host_index + 1
    return [Nic("lo", ("127.0.0.1/8",)), Nic("eth0", (f"10.1.0.{x}/24",)), Nic("eth1", (f"10.2.0.{x}/24",)),
            Nic("docker0", ("172.17.0.1/16",)), *extra]


def reach(reports, broken=(), answers=None):
    """Every probe of every non-lo address is "ok" except `broken` (src, dst, nic) and `answers` overrides."""
    out = {}
    for src in reports:
        for dst, ns in reports.items():
            for n in ns:
                for a in n.addresses if src != dst and n.name != "lo" else ():
                    ok = (src, dst, n.name) not in broken
                    out[(src, dst, n.name, str(a.ip))] = "ok" if ok else "timed out"
    out.update(answers or {})
    return out


def names(found):
    return [r.name for r in found]


def test_all_reachable_by_name_excluding_docker_and_lo():
    reports = {h: nics(i) for i, h in enumerate(H)}
    found = routable_nics(reports, reach(reports))
    assert found == [RoutableNic(tuple((h, "eth0") for h in H)), RoutableNic(tuple((h, "eth1") for h in H))]


def test_docker0_answering_with_the_probers_own_identity_is_not_routable():
    reports = {h: nics(i) for i, h in enumerate(H)}
    wrong = {(s, d, "docker0", "172.17.0.1"): f"answered by {s}" for s in H for d in H if s != d}
    assert names(routable_nics(reports, reach(reports, answers=wrong), include_excluded=True)) == ["eth0", "eth1"]
    assert names(routable_nics(reports, reach(reports), include_excluded=True)) == ["docker0", "eth0", "eth1"]


def test_one_failing_ordered_pair_drops_the_nic():
    reports = {h: nics(i) for i, h in enumerate(H)}
    assert names(routable_nics(reports, reach(reports, broken={("h3", "h1", "eth1")}))) == ["eth0"]


def test_nic_on_one_host_only_and_down_nics_do_not_count():
    reports = {h: nics(i) for i, h in enumerate(H)}
    reports["h2"] = nics(1, Nic("eth2", ("10.3.0.3/24",)))
    reports["h3"] = [n if n.name != "eth1" else Nic("eth1", n.addresses, up=False) for n in nics(2)]
    assert names(routable_nics(reports, reach(reports))) == ["eth0"]


def test_different_names_are_matched_by_subnet():
    reports = {"a": [Nic("eth0", ("10.1.0.2/24",)), Nic("ib0", ("10.9.0.2/16",))],
               "b": [Nic("ens5", ("10.1.0.3/24",)), Nic("ib0", ("10.9.0.3/16",))]}
    found = routable_nics(reports, reach(reports))
    assert found == [RoutableNic((("a", "ib0"), ("b", "ib0"))),
                     RoutableNic((("a", "eth0"), ("b", "ens5")), "10.1.0.0/24")]
    assert found[1].name == "10.1.0.0/24" and dict(found[1].ifnames)["b"] == "ens5"
    assert names(routable_nics(reports, reach(reports, broken={("a", "b", "ens5")}))) == ["ib0"]


@pytest.mark.parametrize("prefix", ["veth12ab", "virbr0", "docker_gwbridge"])
def test_excluded_prefixes_unless_asked(prefix):
    reports = {h: [Nic(prefix, (f"10.5.0.{i + 2}/24",))] for i, h in enumerate(H)}
    assert routable_nics(reports, reach(reports)) == []
    assert names(routable_nics(reports, reach(reports), include_excluded=True)) == [prefix]


def test_single_host_needs_no_probe():
    assert names(routable_nics({"h1": nics(0)}, {})) == ["eth0", "eth1"]


def test_no_hosts_is_an_error():
    with pytest.raises(ValueError):
        routable_nics({}, {})


def test_probe_result_failures_and_nic_json_round_trip():
    r = ProbeResult({"a": (Nic("eth0", ("10.1.0.2/24",)),)},
                    {("b", "a", "eth0", "10.1.0.2"): "timed out", ("c", "a", "eth0", "10.1.0.2"): "ok"})
    assert r.failures() == ["b -> a eth0 10.1.0.2: timed out"]
    n = Nic("eth1", ("10.2.0.3/24",), True, 10000, 9000)
    assert Nic.from_json(json.loads(json.dumps(n.to_json()))) == n


def test_local_nics_has_loopback():
    lo = [n for n in local_nics() if n.name == "lo"]
    assert lo and str(lo[0].addresses[0]) == "127.0.0.1/8"


def test_probe_checks_identity_on_loopback():
    """The prober side against a real listener: right identity ok, wrong identity named, closed port refused."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]

    def answer():
        for _ in range(2):
            conn, _ = srv.accept()
            with conn:
                conn.sendall(b"h1 n0nce\n")
    threading.Thread(target=answer, daemon=True).start()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    rows = probe({"timeout": 2, "targets": [["h1", "lo", "127.0.0.1", port, "h1 n0nce"],
                                             ["h2", "lo", "127.0.0.1", port, "h2 other"],
                                             ["h3", "lo", "127.0.0.1", closed_port, "h3 x"]]})
    srv.close()
    assert [r[3] for r in rows] == ["ok", "answered by h1", "Connection refused"]


def test_cached_nics_must_still_be_up_everywhere():
    from trainrun.plan.facts import HostFacts
    from trainrun.net.choice import nics_present

    def host(*nics):
        return HostFacts(hostname="h", cpus=1, python="p", trainrun="t", nics=nics)

    up = Nic("eth1", ("10.0.0.1/24",))
    down, bare = Nic("eth1", ("10.0.0.1/24",), up=False), Nic("eth1")
    assert nics_present(["eth1"], {"a": host(up), "b": host(up)})
    assert not nics_present(["eth1"], {"a": host(up), "b": host(down)})
    assert not nics_present(["eth1"], {"a": host(up), "b": host(bare)})
    assert not nics_present(["eth1", "ib0"], {"a": host(up), "b": host(up)})


def test_host_facts_roundtrip_json_and_ignore_unknown_keys():
    from trainrun.plan.facts import HostFacts

    f = HostFacts(hostname="h1", cpus=4, python="/p", trainrun="0.1", gpus=(0, 1), nics=(Nic("eth1", ("10.0.0.2/24",)),),
                  vendor="MPICH", mpi="MPICH 5")
    doc = f.to_json()
    assert HostFacts.from_json({**doc, "from_a_newer_version": 1}) == f
    assert f.address_on("eth1") == "10.0.0.2" and f.address_on("eth9") is None


def test_probe_targets_are_every_other_hosts_listeners_with_their_identity():
    tables = {"h1": {"listen": [["eth0", "10.1.0.2", 4000], ["eth1", "10.2.0.2", 4001]]},
              "h2": {"listen": [["eth0", "10.1.0.3", 5000]]},
              "h3": {"listen": []}}
    nonces = {"h1": "n1", "h2": "n2", "h3": "n3"}
    assert probe_targets(tables, nonces, "h1") == [["h2", "eth0", "10.1.0.3", 5000, "h2 n2"]]
    assert probe_targets(tables, nonces, "h3") == [["h1", "eth0", "10.1.0.2", 4000, "h1 n1"],
                                                   ["h1", "eth1", "10.2.0.2", 4001, "h1 n1"],
                                                   ["h2", "eth0", "10.1.0.3", 5000, "h2 n2"]]
