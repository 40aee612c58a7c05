"""The NICs a multi-host job uses, and the cache that spares a launch the probe.

`choose_nics` is what a launch exports as NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME/UCX_NET_DEVICES:
--network-interface when given, else the last hour's choice for the same host set (while those NICs are
still up everywhere), else a fresh probe's. The one rule of which probed NICs count is `usable_names`
(NICs of one name on every host); `--check` applies it to its own probe round and records the result in the
same cache, so a check and the launch after it name the same NICs.
"""
from __future__ import annotations

import os
import time
from typing import Mapping, NamedTuple, Sequence

from trainrun.plan.facts import HostFacts
from trainrun.plan.hosts import HostSpec

CACHE_TTL = 3600.0


class NicOptions(NamedTuple):  # (not a dataclass: see plan/planner.py's note)
    """`pinned`: --network-interface's NICs (() : the probe chooses). `no_cache`: --no-cache. `reached_as`: how
    the hosts are reached (fanout/select.ReachOptions.cache_key): one cache entry per host set as reached."""

    pinned: tuple[str, ...] = ()
    no_cache: bool = False
    reached_as: tuple[str, ...] = ()


def cache_dir() -> str:
    """Where choices are kept: $TRAINRUN_CACHE_DIR, else ~/.cache/trainrun (read at each use, so a test or a
    wrapper may set it after import)."""
    return os.path.expanduser(os.environ.get("TRAINRUN_CACHE_DIR", "~/.cache/trainrun"))


def probe_nics(engine, hosts: list[str], python, include_excluded: bool = False, servers: dict | None = None):
    """(routable NICs as nics.RoutableNic, per-host reports, failure lines) via the probe through `engine`;
    `python`: each host's interpreter ({host: path}, from its facts) or one path for all. With `servers`
    ({host: ProbeServer}, one per host, running) only the probe round runs; they stay the caller's to close."""
    from trainrun.net import nics

    if servers is not None:
        result = nics.probe_served(engine, python, {h: s.table for h, s in servers.items()},
                                   {h: s.nonce for h, s in servers.items()})
    else:
        result = nics.probe_hosts(engine, hosts, python)
    return result.routable(include_excluded), result.reports, result.failures()


def usable_names(routable: Sequence) -> list[str]:
    """The names of the routable NICs (net/nics.RoutableNic) a job can use: those with one name on every host
    (a NIC matched by subnet under different names cannot be named in NCCL_SOCKET_IFNAME). Pure."""
    return [r.name for r in routable if r.subnet is None]


def picked(opts: NicOptions, routable: Sequence) -> tuple[str, ...]:
    """The NICs a job with this probe result uses: --network-interface's when given, else usable_names. Pure."""
    return opts.pinned or tuple(usable_names(routable))


def choose_nics(opts: NicOptions, hosts: list[HostSpec], engine, facts: Mapping[str, HostFacts]) -> tuple[str, ...]:
    """The NICs a multi-host launch exports (NICs with the same name on every host); () for one machine. Every
    mode asks this (a launch, each elastic attempt, --dry-run, --mpi openmpi; --check applies `picked`).
    When this machine is one of the hosts and `engine` cannot reach it (SSH), its side of the probe runs here
    as a child process: a launch from one of the hosts gets the same choice as one from outside them.
    `facts`: every host's HELLO facts (their NIC lists tell whether a cached choice still holds)."""
    if len(hosts) < 2 or all(h.is_local for h in hosts):
        return ()  # one machine: no NIC between hosts to choose (whatever --network-interface says)
    if opts.pinned:
        return opts.pinned
    if any(h.name not in facts for h in hosts):
        return ()  # hosts not reached (--dry-run, --mpi openmpi): no probe without them
    local = {h.name for h in hosts if h.is_local}
    if local and not engine.reaches_local:
        engine = _HereToo(engine, local)
    cached = None if opts.no_cache else cached_nic_choice(hosts, opts)
    if cached is not None and nics_present(cached, facts):
        return tuple(cached)
    routable, _, _ = probe_nics(engine, [h.name for h in hosts], {h.name: facts[h.name].python for h in hosts})
    names = usable_names(routable)
    save_nic_choice(hosts, opts, names)
    return tuple(names)


def nics_present(nics, facts: Mapping[str, HostFacts]) -> bool:
    """Every named NIC is up with an address on every host (per the hosts' own NIC lists). Pure."""
    return all((nic := f.nic(name)) is not None and nic.usable for name in nics for f in facts.values())


def _cache_path(hosts: list[HostSpec], opts: NicOptions) -> str:
    """One cache entry per host set *as reached*: the same names through another ssh config or port
    (another cluster, another testbed) must not share a NIC choice."""
    import hashlib  # (here: a launch of one machine never needs it, and it costs ms at start-up)

    ident = [",".join(sorted(str(h) for h in hosts)), *opts.reached_as]
    key = hashlib.sha256("|".join(ident).encode()).hexdigest()[:16]
    return os.path.join(cache_dir(), f"nics-{key}.json")


def save_nic_choice(hosts: list[HostSpec], opts: NicOptions, nics: list[str]) -> None:
    import json  # (here and below: a one-host launch has no NICs to choose and never imports it)

    os.makedirs(cache_dir(), exist_ok=True)
    with open(_cache_path(hosts, opts), "w") as f:
        json.dump({"time": time.time(), "nics": nics}, f)


def cached_nic_choice(hosts: list[HostSpec], opts: NicOptions) -> list[str] | None:
    import json

    try:
        with open(_cache_path(hosts, opts)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc["nics"] if time.time() - doc.get("time", 0) < CACHE_TTL else None


class _HereToo:
    """`engine` for the remote hosts, a child process of this one for `local` (this machine's names): what
    the NIC probe needs to run on every host of a launch that includes the launcher's own machine."""

    reaches_local = True

    def __init__(self, engine, local: set[str]):
        self.engine, self.local = engine, local

    def run_module(self, host: str, module: str, *args: str, python: str | None = None, timeout: float = 30.0):
        if host in self.local:
            import sys

            from trainrun.fanout.pipe_engine import PipeModuleChannel

            return PipeModuleChannel([python or sys.executable, "-m", module, *args])
        return self.engine.run_module(host, module, *args, python=python, timeout=timeout)
