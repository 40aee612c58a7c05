"""Network interfaces: what this host has (psutil), and which NICs connect ALL hosts of a job (the probe).

The probe, after Horovod's: every host runs `python -m trainrun.net.nics serve HOST NONCE`, which listens on each
IPv4 address of each up, non-loopback NIC and answers every connection with "HOST NONCE"; then every host
runs `python -m trainrun.net.nics probe`, which connects to every listening address of every other host and
reports who answered. A NIC counts only if every ordered pair of hosts got the expected identity back: an
address that is the same on every host (docker0's 172.17.0.1) reaches the prober's own machine, and a subnet
that exists everywhere may still not be connected (a NIC on another switch). `trainrun --check` starts its
servers as `python -m trainrun.facts serve HOST NONCE`, whose first line also carries the host's facts (one
remote process per host before the probe round), then runs only the probe round (probe_served).

    python -m trainrun.net.nics list              this host's NICs as JSON
    python -m trainrun.net.nics serve HOST NONCE  (probe server) one JSON line, then serve until stdin closes
    python -m trainrun.net.nics probe             (prober) targets as JSON on stdin, results as JSON on stdout
"""
from __future__ import annotations

import ipaddress
import json
import os
import secrets
import selectors
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence, cast

from trainrun.errors import HostError, HostsError
from trainrun.plan.facts import Nic

if TYPE_CHECKING:
    from trainrun.fanout.base import FanoutEngine, ModuleChannel

EXCLUDED_PREFIXES = ("docker", "veth", "virbr")

# (source host, destination host, destination NIC, destination address) -> "ok" or why not
Reach = Mapping[tuple[str, str, str, str], str]


def local_nics() -> list[Nic]:
    """This host's interfaces, sorted by name (all of them: up or down, with or without IPv4)."""
    import psutil

    stats = psutil.net_if_stats()
    nics = []
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        st = stats.get(name)
        v4 = tuple(ipaddress.IPv4Interface(f"{a.address}/{a.netmask or '32'}")
                   for a in addrs if a.family == socket.AF_INET)
        nics.append(Nic(name, v4, bool(st and st.isup), st.speed if st else 0, st.mtu if st else 0))
    return nics


@dataclass(frozen=True)
class RoutableNic:
    """A network that connects every host of the job to every other. `ifnames` holds (host, NIC name) in host
    order; names may differ between hosts when `subnet` is set (matched by subnet, not by name)."""

    ifnames: tuple[tuple[str, str], ...]
    subnet: str | None = None

    @property
    def name(self) -> str:
        """The common NIC name, or the subnet when the hosts name it differently."""
        names = {n for _, n in self.ifnames}
        return names.pop() if len(names) == 1 else str(self.subnet)


def is_excluded(name: str) -> bool:
    """Container and VM bridges and their veths: not a job's network unless asked for."""
    return name.startswith(EXCLUDED_PREFIXES)


def routable_nics(reports: Mapping[str, Sequence[Nic]], probe_results: Reach,
                  include_excluded: bool = False) -> list[RoutableNic]:
    """The NICs routable between ALL hosts of `reports` ({host: its NICs}), from `probe_results`.

    First by name: a NIC name every host has (up, with IPv4) counts if, for every ordered pair of hosts, one
    of the destination NIC's addresses answered "ok". Then by subnet, for NICs named differently: a subnet
    every host has an address in counts if every pair reached those addresses. lo/docker*/veth*/virbr* are
    left out unless `include_excluded` (loopback addresses always). Order: by name, then by subnet."""
    hosts = list(reports)
    if not hosts:
        raise ValueError("no hosts")
    usable = {h: {n.name: n for n in reports[h] if n.up and n.name != "lo" and n.addresses
                  and not any(a.ip.is_loopback for a in n.addresses)
                  and (include_excluded or not is_excluded(n.name))} for h in hosts}

    def reached(group: dict[str, tuple[str, list[str]]]) -> bool:  # host -> (NIC, its addresses to try)
        return all(any(probe_results.get((src, dst, group[dst][0], a)) == "ok" for a in group[dst][1])
                   for dst in hosts for src in hosts if src != dst)

    found = []
    for name in sorted(set.intersection(*(set(usable[h]) for h in hosts))):
        group = {h: (name, [str(a.ip) for a in usable[h][name].addresses]) for h in hosts}
        if reached(group):
            found.append(RoutableNic(tuple((h, name) for h in hosts)))
    nets = [{a.network: (nic.name, str(a.ip)) for nic in usable[h].values() for a in nic.addresses} for h in hosts]
    for net in sorted(set.intersection(*(set(n) for n in nets))):
        group = {h: (nets[i][net][0], [nets[i][net][1]]) for i, h in enumerate(hosts)}
        if len({nic for nic, _ in group.values()}) > 1 and reached(group):
            found.append(RoutableNic(tuple((h, group[h][0]) for h in hosts), str(net)))
    return found


@dataclass(frozen=True)
class ProbeResult:
    """What probe_hosts saw: every host's NICs and every probe's outcome (see Reach)."""

    reports: dict[str, tuple[Nic, ...]]
    reach: dict[tuple[str, str, str, str], str]

    def routable(self, include_excluded: bool = False) -> list[RoutableNic]:
        return routable_nics(self.reports, self.reach, include_excluded)

    def failures(self) -> list[str]:
        """One line per failed probe: `src -> dst NIC address: why`."""
        return [f"{s} -> {d} {n} {a}: {why}" for (s, d, n, a), why in sorted(self.reach.items()) if why != "ok"]


def probe_hosts(engine: FanoutEngine, hosts: Sequence[str], python: str | Mapping[str, str],
                timeout: float = 10.0) -> ProbeResult:
    """Run the probe on every host through `engine` (reached already). `python` (one path, or one per host,
    e.g. what each host's facts reported) must have trainrun installed there.
    Every host serves, then all probe at once (probe_served); servers end when their channel closes, which
    this function does before it returns or raises. Raises HostsError (stage "probe") naming each host that failed."""
    nonces = {h: secrets.token_hex(8) for h in hosts}
    channels: list[Any] = []
    try:
        servers = {h: _start(engine, h, python, ["serve", h, nonces[h]], timeout, channels) for h in hosts}
        tables = _gather(servers, lambda ch: ch.readline())
        return probe_served(engine, python, tables, nonces, timeout)
    finally:
        for ch in channels:
            ch.close()


def probe_served(engine: FanoutEngine, python: str | Mapping[str, str], tables: Mapping[str, dict],
                 nonces: Mapping[str, str], timeout: float = 10.0) -> ProbeResult:
    """The probe round alone, for hosts that already run a probe server (`python -m trainrun.net.nics serve` or
    `python -m trainrun.facts serve`): `tables` holds each server's first line, `nonces` the nonce it was
    started with. Every host probes all others at once; the servers are the caller's to close, after this
    returns. Raises HostsError (stage "probe") naming each host whose prober failed."""
    channels: list[Any] = []
    try:
        probers = {}
        for h in tables:
            probers[h] = ch = _start(engine, h, python, ["probe"], timeout, channels)
            ch.send(json.dumps({"targets": probe_targets(tables, nonces, h), "timeout": min(timeout, 2.0)}).encode())
            ch.close_stdin()
        results = _gather(probers, lambda ch: ch.read())
    finally:
        for ch in channels:
            ch.close()
    reports = {h: tuple(Nic.from_json(n) for n in t["nics"]) for h, t in tables.items()}
    reach = {(src, d, n, a): why for src, rows in results.items() for d, n, a, why in rows["results"]}
    return ProbeResult(reports, reach)


def probe_targets(tables: Mapping[str, dict], nonces: Mapping[str, str], prober: str) -> list[list]:
    """What `prober` connects to: [host, nic, addr, port, expected identity] for every listening address of
    every other host (`tables`: each server's first line). Pure."""
    return [[d, name, addr, port, f"{d} {nonces[d]}"]
            for d, t in tables.items() if d != prober for name, addr, port in t["listen"]]


def _start(engine: FanoutEngine, host: str, python: str | Mapping[str, str], argv: list[str],
           timeout: float, channels: list) -> ModuleChannel:
    """`python -m trainrun.net.nics ARGV` on `host` (appended to `channels`, for the caller to close)."""
    try:
        exe = python if isinstance(python, str) else python[host]
        ch = engine.run_module(host, "trainrun.net.nics", *argv, python=exe, timeout=timeout)
        channels.append(ch)
        return ch
    except Exception as e:  # the engine's transport errors (SSH, srun): the host is named, not a traceback
        raise HostsError([HostError(host, "probe", f"cannot start the NIC probe: {e or type(e).__name__}",
                                    hint="the connection to the host was lost")]) from None


def _gather(channels: dict, read) -> dict:
    """{host: JSON parsed from read(its channel)}; raises HostsError with each host whose output is missing
    or not JSON, naming the last line of its stderr."""
    out, failures = {}, []
    for host, ch in channels.items():
        try:
            out[host] = json.loads(read(ch))
        except (OSError, ValueError) as e:  # at EOF all stderr has arrived; after a timeout take what is there
            err = ch.stderr_text().strip().splitlines()
            why = err[-1] if err else f"no answer ({type(e).__name__})"
            failures.append(HostError(host, "probe", f"NIC probe failed: {why}",
                                      hint="trainrun must be installed for the same python on every host"))
    if failures:
        raise HostsError(failures)
    return out


def listen_on_nics(nics) -> tuple[selectors.BaseSelector, list[list]]:
    """A listening socket (kernel-chosen port) on every IPv4 address of every up, non-loopback NIC in `nics`,
    registered in a new selector; and [[nic, address, port]] of them. An address that cannot be bound is
    left out (it is simply never reached)."""
    sel, listen = selectors.DefaultSelector(), []
    for nic in nics:
        for a in nic.addresses if nic.up else ():
            if a.ip.is_loopback:
                continue
            s = socket.socket()
            try:
                s.bind((str(a.ip), 0))
            except OSError:
                s.close()
                continue
            s.listen(64)
            sel.register(s, selectors.EVENT_READ)
            listen.append([nic.name, str(a.ip), s.getsockname()[1]])
    return sel, listen


def serve(host: str, nonce: str, lifetime: float = 600.0, extra: dict | None = None) -> None:
    """Probe server: print {"host", "nics", "listen": [[nic, addr, port]...], **extra} as one line, then answer
    every connection with "HOST NONCE" until stdin reaches EOF (the SSH channel closed) or `lifetime` seconds.
    `extra` rides on that line (`python -m trainrun.facts serve` puts the host's check facts there)."""
    nics = local_nics()
    sel, listen = listen_on_nics(nics)
    print(json.dumps({"host": host, "nics": [n.to_json() for n in nics], "listen": listen, **(extra or {})}), flush=True)
    threading.Thread(target=lambda: (sys.stdin.buffer.read(), os._exit(0)), daemon=True).start()
    timer = threading.Timer(lifetime, os._exit, (0,))
    timer.daemon = True
    timer.start()
    identity = f"{host} {nonce}\n".encode()
    while True:
        for key, _ in sel.select():
            try:
                conn, _ = cast(socket.socket, key.fileobj).accept()
                with conn:
                    conn.sendall(identity)
            except OSError:
                pass  # a prober that gave up; keep serving the others


def probe(spec: dict) -> list[list[str]]:
    """Connect to every target [host, nic, addr, port, expected identity] at once; [host, nic, addr, why]
    rows, why = "ok" when the expected identity answered."""
    def one(target):
        host, nic, addr, port, expected = target
        try:
            with socket.create_connection((addr, port), timeout=spec["timeout"]) as c:
                c.settimeout(spec["timeout"])
                got = c.makefile("rb").readline().decode(errors="replace").strip()
        except (TimeoutError, socket.timeout):
            return [host, nic, addr, "timed out"]
        except OSError as e:
            return [host, nic, addr, e.strerror or type(e).__name__]
        return [host, nic, addr, "ok" if got == expected else f"answered by {got.split(' ')[0] or 'nobody'}"]

    with ThreadPoolExecutor(max_workers=max(1, min(64, len(spec["targets"])))) as pool:
        return list(pool.map(one, spec["targets"]))


def main(argv: list[str]) -> int:
    if argv == ["list"]:
        print(json.dumps([n.to_json() for n in local_nics()]))
    elif len(argv) == 3 and argv[0] == "serve":
        serve(argv[1], argv[2])
    elif argv == ["probe"]:
        print(json.dumps({"results": probe(json.load(sys.stdin))}))
    else:
        print(__doc__.rsplit("\n\n", 1)[1], file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
