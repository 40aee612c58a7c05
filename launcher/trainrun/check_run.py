"""Collect what `trainrun --check` reports: every host's facts (in parallel, one SSH connection each;
with several hosts the same remote process then serves the NIC probe), the probe round, then the rank
plan; checks.py judges and renders. Also the NIC choice that a multi-host launch uses (cached per host
set for CACHE_TTL seconds).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from trainrun.checks import CheckReport, HostCheck, evaluate
from trainrun.errors import HostError, UsageError
from trainrun.hosts import HostSpec
from trainrun.placement import assign_ranks, ranks_per_host

CACHE_TTL = 3600.0
CACHE_DIR = os.path.expanduser(os.environ.get("TRAINRUN_CACHE_DIR", "~/.cache/trainrun"))


@dataclass(frozen=True)
class ProbeServer:
    """A host's probe server, started with its facts (`python -m trainrun.facts serve HOST NONCE`): the
    channel it runs on (closing it ends the server), its first line less the facts, and its nonce."""

    channel: object
    table: dict
    nonce: str


def _remote_facts(host: HostSpec, opts, python: str, timeout: float, serve: bool = False):
    """(HostCheck, client or None, ProbeServer or None) for one remote host. With `serve`, the facts come
    from a probe server started in the same remote process, left running for the probe round."""
    from trainrun import ssh  # before paramiko: ssh.py imports it without `invoke` (faster)
    from trainrun.remote import python_module_command

    import paramiko

    try:
        client = ssh.connect(str(host), opts)
    except HostError as err:
        return HostCheck(host.name, host.slots, err.stage, f"{err.message} ({err.hint})" if err.hint else err.message), None, None
    nonce = os.urandom(8).hex() if serve else None
    try:
        command = python_module_command(python, "trainrun.facts", *(["serve", host.name, nonce] if serve else []))
        # A bare channel, not exec_command: its stdin file would send EOF (ending the server) when collected.
        ch = client.get_transport().open_session(timeout=timeout)
        ch.settimeout(timeout)
        ch.exec_command(command)
        out = ch.makefile("rb")
        text = (out.readline() if serve else out.read()).decode()
        if not serve or not text:  # a server that printed nothing has exited: its status and stderr say why
            status = ch.recv_exit_status()
            if status != 0 or not text:
                last = (ch.makefile_stderr("rb").read().decode(errors="replace").strip().splitlines() or ["no output"])[-1]
                hint = " (install trainrun there, or pass --python)" if "No module named" in last else ""
                ch.close()
                return HostCheck(host.name, host.slots, "facts", f"{last}{hint}"), client, None
        doc = json.loads(text)
        if not serve:
            return HostCheck(host.name, host.slots, facts=doc), client, None
        facts = doc.pop("facts")
        return HostCheck(host.name, host.slots, facts=facts), client, ProbeServer(ch, doc, nonce)
    except (OSError, EOFError, ValueError, KeyError, paramiko.SSHException) as exc:
        return HostCheck(host.name, host.slots, "facts", f"no answer from trainrun.facts ({type(exc).__name__})"), client, None


def _local_facts(host: HostSpec, timeout: float):
    """(HostCheck, None, None) for this machine: the same shape as _remote_facts, no SSH, no server."""
    r = subprocess.run([sys.executable, "-m", "trainrun.facts"], capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        return HostCheck(host.name, host.slots, "facts", (r.stderr.strip().splitlines() or ["failed"])[-1], via="local"), None, None
    return HostCheck(host.name, host.slots, facts=json.loads(r.stdout), via="local"), None, None


def _progress(done: int, total: int) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\rchecking hosts: {done}/{total} answered" + ("\n" if done == total else ""))
        sys.stderr.flush()


def collect_hosts(hosts: list[HostSpec], cfg, serve: bool = False) -> tuple[list[HostCheck], dict, dict]:
    """Every host's HostCheck (in the given order), the SSH clients of the reached remote hosts and, with
    `serve`, their running probe servers ({host: ProbeServer}; the caller closes their channels)."""
    from trainrun.remote import ssh_options

    python = cfg.python or sys.executable
    opts = ssh_options(cfg) if any(not h.is_local for h in hosts) else None
    results: dict[str, HostCheck] = {}
    clients, servers = {}, {}
    with ThreadPoolExecutor(max_workers=max(1, min(cfg.ssh_parallelism, len(hosts)))) as pool:
        futures = {
            pool.submit(_local_facts, h, cfg.ssh_timeout + 30) if h.is_local
            else pool.submit(_remote_facts, h, opts, python, cfg.ssh_timeout + 30, serve): h for h in hosts
        }
        _progress(0, len(hosts))
        for n, fut in enumerate(futures, 1):
            h = futures[fut]
            results[h.name], client, server = fut.result()
            if client is not None:
                clients[h.name] = client
            if server is not None:
                servers[h.name] = server
            _progress(n, len(hosts))
    return [results[h.name] for h in hosts], clients, servers


def probe_nics(clients: dict, python, include_excluded: bool = False, servers: dict | None = None):
    """(routable NICs as nics.RoutableNic, per-host reports, failure lines) via the probe over `clients`;
    `python`: each host's interpreter ({host: path}, from its facts) or one path for all. With `servers`
    ({host: ProbeServer}, one per client, running) only the probe round runs; they stay the caller's to close."""
    from trainrun import nics

    if servers is not None:
        result = nics.probe_served(clients, python, {h: s.table for h, s in servers.items()},
                                   {h: s.nonce for h, s in servers.items()})
    else:
        result = nics.probe_hosts(clients, python)
    return result.routable(include_excluded), result.reports, result.failures()


def nic_rows(reports: dict, routable: list, failures: list[str]) -> list[tuple]:
    from trainrun.nics import is_excluded

    chosen = {(h, n) for r in routable for h, n in r.ifnames}
    rows = []
    for host, host_nics in reports.items():
        for nic in host_nics:
            if nic.name == "lo":
                continue
            if (host, nic.name) in chosen:
                verdict = "routable"
            elif is_excluded(nic.name):
                verdict = "excluded (container/VM bridge)"
            else:
                verdict = "not routable to all hosts" if nic.up else "down"
            rows.append((host, nic.name, ",".join(str(a) for a in nic.addresses) or "-", "up" if nic.up else "down",
                         f"{nic.speed} Mb/s" if nic.speed else "?", verdict))
    return rows


def choose_nics(cfg, hosts: list[HostSpec], clients: dict, pythons: dict[str, str], host_nics: dict) -> tuple[str, ...]:
    """The NICs a multi-host launch exports: --network-interface, else the cached or a fresh probe's
    choice (NICs with the same name on every host). A cached choice is used only while those NICs are
    still up on every host (`host_nics`: each host's NIC list from its HELLO). () for one host, or when
    the probe cannot run."""
    if cfg.network_interface:
        return tuple(cfg.network_interface.split(","))
    if len(hosts) < 2 or len(clients) < len(hosts):
        return ()
    cached = None if cfg.no_cache else cached_nic_choice(hosts, cfg)
    if cached is not None and nics_present(cached, host_nics):
        return tuple(cached)
    routable, _, _ = probe_nics(clients, pythons)
    names = [r.name for r in routable if r.subnet is None]
    save_nic_choice(hosts, cfg, names)
    return tuple(names)


def run_check(cfg) -> CheckReport:
    hosts = cfg.host_specs()
    np = cfg.num_proc if cfg.num_proc is not None else sum(h.slots for h in hosts)
    problems = []
    try:
        counts = ranks_per_host(hosts, np, cfg.oversubscribe)
    except UsageError as err:  # e.g. -np above the slots: a problem to report; the hosts are still checked
        counts, problems = [0] * len(hosts), [str(err)]
    need_nic = len(hosts) > 1 and any(not h.is_local for h in hosts)  # all local: one machine
    checks, clients, servers = collect_hosts(hosts, cfg, serve=need_nic)
    try:
        routable, reports, failures = [], {}, []
        reached = [c for c in checks if c.ok]
        if need_nic and len(reached) == len(hosts) and len(clients) == len(hosts):
            try:
                pythons = {c.host: c.facts["python"] for c in checks}
                routable, reports, failures = probe_nics(clients, pythons, servers=servers)
            except HostError as err:
                problems.append(str(err))
        elif need_nic and len(clients) < len(hosts) and len(reached) == len(hosts):
            problems.append("the NIC probe needs SSH to every host; list this machine by a remote-reachable name")
        nic_names = [r.name for r in routable]
        if cfg.network_interface:
            pinned = cfg.network_interface.split(",")
            missing = [n for n in pinned if n not in nic_names]
            if need_nic and missing:
                problems.append(f"--network-interface {','.join(missing)}: not routable between all hosts (routable: {', '.join(nic_names) or 'none'})")
            nic_names = pinned
        local = {h.name: c for h, c in zip(hosts, counts)}
        more, warnings = evaluate(checks, nic_names, local, need_nic=need_nic and not cfg.network_interface,
                                  allow_gpu_sharing=cfg.allow_gpu_sharing, gpus_per_proc=cfg.gpus_per_proc or 1,
                                  mpi=cfg.mpi != "none")
        problems += more
        ranks = []
        if not problems:
            pools = {c.host: tuple(c.facts.get("gpus", ())) for c in checks}
            ranks = assign_ranks(hosts, np, oversubscribe=cfg.oversubscribe, gpu_pools=pools,
                                 gpus_per_proc=cfg.gpus_per_proc or 1, allow_gpu_sharing=cfg.allow_gpu_sharing)
        if routable:
            save_nic_choice(hosts, cfg, nic_names)
        return CheckReport(checks, nic_names, nic_rows(reports, routable, failures), ranks, problems, warnings)
    finally:
        for s in servers.values():
            s.channel.close()
        for c in clients.values():
            c.close()


def _cache_path(hosts: list[HostSpec], cfg) -> str:
    """One cache entry per host set *as reached*: the same names through another ssh config or port
    (another cluster, another testbed) must not share a NIC choice."""
    ident = [",".join(sorted(str(h) for h in hosts)), str(cfg.ssh_config), str(cfg.ssh_port), str(cfg.ssh_identity_file)]
    key = hashlib.sha256("|".join(ident).encode()).hexdigest()[:16]
    return os.path.join(CACHE_DIR, f"nics-{key}.json")


def save_nic_choice(hosts: list[HostSpec], cfg, nics: list[str]) -> None:
    os.makedirs(CACHE_DIR, exist_ok=True)
    with open(_cache_path(hosts, cfg), "w") as f:
        json.dump({"time": time.time(), "nics": nics}, f)


def cached_nic_choice(hosts: list[HostSpec], cfg) -> list[str] | None:
    try:
        with open(_cache_path(hosts, cfg)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc["nics"] if time.time() - doc.get("time", 0) < CACHE_TTL else None


def nics_present(nics, host_nics: dict[str, list[dict]]) -> bool:
    """Every named NIC is up with an address on every host (per the hosts' own NIC lists). Pure."""
    return all(any(n["name"] == name and n["up"] and n["addresses"] for n in host) for name in nics for host in host_nics.values())
