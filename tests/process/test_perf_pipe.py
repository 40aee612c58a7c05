"""check/perf.run_perf through the pipe engine: two "hosts" that are local linkbench processes, measured over
this machine's first non-loopback NIC (no testbed needed: the orchestration, the wire and the probes are real)."""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from trainrun.check.perf import run_perf
from trainrun.check.perf_verdict import findings
from trainrun.facts.collect import check_facts
from trainrun.fanout.pipe_engine import PipeEngine
from trainrun.net.nics import RoutableNic, local_nics


def test_two_local_hosts_are_measured_and_their_probes_end():
    nic = next((n for n in local_nics() if n.usable and n.name != "lo" and not n.addresses[0].ip.is_loopback), None)
    if nic is None:
        pytest.skip("no non-loopback NIC with an IPv4 address on this machine")
    facts = check_facts()
    spec = SimpleNamespace(perf_time=None, plan=SimpleNamespace(mpi="none"), nics=SimpleNamespace(pinned=()),
                           reach=SimpleNamespace(ssh_parallelism=8), supervision=SimpleNamespace(host_answer=45.0))
    r = run_perf(spec, PipeEngine(), {"A": facts, "B": facts}, [RoutableNic((("A", nic.name), ("B", nic.name)))])
    assert r.skipped == [] and r.rounds == 1 and r.nics == [nic.name]
    assert {(s.src, s.dst) for s in r.links} == {("A", "B"), ("B", "A")}
    assert all(s.mbps and s.mbps > 10 and s.rtt_us > 0 for s in r.links), r.links
    assert [s.host for s in r.host_samples] == ["A", "B"] and all(s.gflops > 0 and s.cpus >= 1 for s in r.host_samples)
    assert all(abs(s.clock_offset_ms) < 1000 for s in r.host_samples)  # same clock: only the round trip
    assert set(r.phases) == {"start", "clocks", "compute", "links"}
    assert not [f for f in findings(r) if f.kind == "version"]  # the same facts twice
    left = subprocess.run(["pgrep", "-f", "trainrun.net.linkbench [AB]$"], capture_output=True, text=True).stdout
    assert left == "", f"linkbench processes left: {left}"


def test_a_stranger_without_the_token_is_not_served():
    """The listening sockets close connections that do not present the check's secret, unread."""
    import json
    import socket

    p = subprocess.Popen([sys.executable, "-m", "trainrun.net.linkbench", "A"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env={**os.environ})
    try:
        p.stdin.write(json.dumps({"token": "right"}) + "\n")
        p.stdin.flush()
        listen = json.loads(p.stdout.readline())["listen"]
        if not listen:
            pytest.skip("no non-loopback address to listen on")
        _, addr, port = listen[0]
        with socket.create_connection((addr, port), timeout=5) as c:
            c.sendall(b"TRLB1 wrong recv 5\n")
            assert c.recv(100) == b""  # closed, nothing streamed
        with socket.create_connection((addr, port), timeout=5) as c:
            c.sendall(b"TRLB1 right ping 1\n")
            assert c.recv(100) == b"A\n"
    finally:
        p.stdin.close()
        assert p.wait(10) == 0
