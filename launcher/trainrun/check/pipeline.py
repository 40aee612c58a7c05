"""Collect what `trainrun --check` reports: every host's facts (in parallel, through the fan-out engine;
with several hosts the same remote process then serves the NIC probe), the probe round, then the rank
plan through the launch's own planner. report.py judges and renders.

The check runs the launch's pipeline on the launch's resolved options (launchspec.LaunchSpec): the same
HostSource, shape_job and assign, the NICs by net/choice's rule (`picked`: --network-interface, else the NICs
of one name on every host; the same choice goes to the NIC cache a launch reads), TF addresses by
plan/planner.host_addresses, and the same time for a host's first answer (Supervision.host_answer).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainrun.check.report import CheckReport, HostCheck, evaluate
from trainrun.errors import HostError, UsageError
from trainrun.plan.facts import HostFacts
from trainrun.fanout.python_pick import NO_PYTHON, no_python_error
from trainrun.net.choice import picked, probe_nics, save_nic_choice
from trainrun.plan.hosts import HostSpec
from trainrun.plan.planner import JobShape, assign, requested_np, shape_job

if TYPE_CHECKING:
    from trainrun.fanout.base import ModuleChannel
    from trainrun.launchspec import LaunchSpec


@dataclass(frozen=True)
class ProbeServer:
    """A host's probe server, started with its facts (`python -m trainrun.facts serve HOST NONCE`): the
    channel it runs on (closing it ends the server), its first line less the facts, and its nonce."""

    channel: ModuleChannel
    table: dict
    nonce: str | None


def _workdir_check(host: HostSpec, facts: HostFacts, missing: str | None, via: str = "remote") -> HostCheck:
    """The HostCheck of a host whose facts came back: failed at stage "workdir" when the ranks' working
    directory is not there (the launch would end with 127 on every rank of it)."""
    if missing is None:
        return HostCheck(host.name, host.slots, facts=facts, via=via)
    return HostCheck(host.name, host.slots, "workdir", f"working directory {missing} does not exist there "
                     "(create it, or pass --workdir)", facts=facts, via=via)


def _remote_facts(engine, host: HostSpec, timeout: float, serve: bool = False, workdir: str | None = None):
    """(HostCheck, ProbeServer or None) for one reached remote host. With `serve`, the facts come from a
    probe server started in the same remote process, left running for the probe round. `workdir`: the
    ranks' working directory, checked there."""
    nonce = os.urandom(8).hex() if serve else None
    ch = None
    args = [*(["--workdir", workdir] if workdir else []), *(["serve", host.name, nonce] if serve else [])]
    try:
        ch = engine.run_module(host.name, "trainrun.facts", *args, timeout=timeout)
        text = (ch.readline() if serve else ch.read()).decode()
        if not serve or not text:  # a server that printed nothing has exited: its status and stderr say why
            status = ch.exit_status()
            if status != 0 or not text:
                stderr = ch.stderr_text()
                ch.close()
                return _start_failure(host, stderr), None
        doc = json.loads(text)
        missing = doc.pop("workdir_missing", None)
        if not serve:
            ch.close()
            return _workdir_check(host, HostFacts.from_json(doc), missing), None
        facts = HostFacts.from_json(doc.pop("facts"))
        return _workdir_check(host, facts, missing), ProbeServer(ch, doc, nonce)
    except Exception as exc:  # the engine's transport (SSH, srun) or a garbled answer: a finding, not a crash
        if ch is not None:
            ch.close()
        return HostCheck(host.name, host.slots, "facts", f"no answer from trainrun.facts ({type(exc).__name__})"), None


def _start_failure(host: HostSpec, stderr: str) -> HostCheck:
    """The HostCheck of a host where `python -m trainrun.facts` did not answer: no interpreter (stage
    "python", from the engine's start line), else the facts stage with its last stderr line."""
    if NO_PYTHON in stderr:
        if (err := no_python_error(host.name, stderr)) is not None:
            return HostCheck(host.name, host.slots, err.stage, f"{err.message} ({err.hint})")
    last = (stderr.strip().splitlines() or ["no output"])[-1]
    hint = " (install trainrun there, or pass --python)" if "No module named" in last else ""
    return HostCheck(host.name, host.slots, "facts", f"{last}{hint}")


def _local_facts(host: HostSpec, timeout: float, workdir: str | None = None) -> HostCheck:
    """This machine's HostCheck: the same facts, no fan-out, no server."""
    r = subprocess.run([sys.executable, "-m", "trainrun.facts"], capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        return HostCheck(host.name, host.slots, "facts", (r.stderr.strip().splitlines() or ["failed"])[-1], via="local")
    missing = workdir if workdir and not os.path.isdir(workdir) else None
    return _workdir_check(host, HostFacts.from_json(json.loads(r.stdout)), missing, via="local")


def _progress(done: int, total: int) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\rchecking hosts: {done}/{total} answered" + ("\n" if done == total else ""))
        sys.stderr.flush()


def collect_hosts(hosts: list[HostSpec], spec: LaunchSpec, engine, serve: bool = False) -> tuple[list[HostCheck], dict]:
    """Every host's HostCheck (in the given order) and, with `serve`, the reached remote hosts' running
    probe servers ({host: ProbeServer}; the caller closes their channels)."""
    remote = [h for h in hosts if not h.is_local or (engine is not None and engine.reaches_local)]
    unreached = engine.reach(remote) if remote else {}
    timeout = spec.supervision.host_answer
    results: dict[str, HostCheck] = {
        name: HostCheck(name, next(h.slots for h in hosts if h.name == name), err.stage,
                        f"{err.message} ({err.hint})" if err.hint else err.message)
        for name, err in unreached.items()}
    servers = {}
    todo = [h for h in hosts if h.name not in results]
    with ThreadPoolExecutor(max_workers=max(1, min(spec.reach.ssh_parallelism, len(todo) or 1))) as pool:
        workdir = spec.plan.workdir or os.getcwd()  # the ranks' working directory, as make_plan gives it
        futures = {pool.submit(_remote_facts, engine, h, timeout, serve, workdir) if h in remote
                   else pool.submit(_local_facts, h, timeout, workdir): h for h in todo}
        _progress(len(results), len(hosts))
        for n, fut in enumerate(futures, len(results) + 1):
            h = futures[fut]
            got = fut.result()
            results[h.name], server = got if isinstance(got, tuple) else (got, None)
            if server is not None:
                servers[h.name] = server
            _progress(n, len(hosts))
    return [results[h.name] for h in hosts], servers


def nic_rows(reports: dict, routable: list, failures: list[str]) -> list[tuple]:
    from trainrun.net.nics import is_excluded

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


def run_check(spec: LaunchSpec) -> CheckReport:
    from trainrun.fanout.select import engine_for

    source = spec.hosts
    hosts, opts = source.hosts, spec.plan
    problems = []
    try:
        shape = shape_job(opts, hosts, source.default_np)
    except UsageError as err:  # e.g. -np above the slots: a problem to report; the hosts are still checked
        shape, problems = JobShape(tuple(hosts), (0,) * len(hosts)), [str(err)]
    need_nic = len(hosts) > 1 and any(not h.is_local for h in hosts)  # all local: one machine
    engine = engine_for(spec.reach, source) if any(not h.is_local for h in hosts) else None
    servers: dict[str, ProbeServer] = {}
    try:
        checks, servers = collect_hosts(hosts, spec, engine, serve=need_nic)
        routable, reports, failures = [], {}, []
        reached = [c for c in checks if c.ok]
        if need_nic and len(reached) == len(hosts) and len(servers) == len(hosts):
            try:
                pythons = {c.host: c.facts.python for c in checks}
                routable, reports, failures = probe_nics(engine, list(servers), pythons, servers=servers)
            except HostError as err:
                problems.append(str(err))
        elif need_nic and len(servers) < len(hosts) and len(reached) == len(hosts):
            problems.append("the NIC probe needs every host reached remotely; list this machine by a remote-reachable name")
        pinned = spec.nics.pinned
        nic_names = list(picked(spec.nics, routable))  # what a launch on these hosts would choose
        if pinned:
            routable_names = [r.name for r in routable]
            missing = [n for n in pinned if n not in routable_names]
            if need_nic and missing:
                problems.append(f"--network-interface {','.join(missing)}: not routable between all hosts (routable: {', '.join(routable_names) or 'none'})")
        local = {h.name: c for h, c in zip(shape.hosts, shape.counts)}
        more, warnings = evaluate(checks, nic_names, local, need_nic=need_nic and not pinned,
                                  allow_gpu_sharing=opts.allow_gpu_sharing, gpus_per_proc=opts.gpus_per_proc,
                                  mpi=opts.mpi != "none" and opts.tf_cluster is None)
        problems += more
        ranks, ps_rows = [], []
        if not problems:
            ranks = assign(opts, shape, {c.host: c.facts for c in checks})
            if opts.tf_cluster is not None:
                ps_rows = ps_step(spec, shape, ranks, checks, tuple(nic_names), engine, problems)
        if routable and not pinned:  # the probe's choice, for the launch that follows (choose_nics reads it)
            save_nic_choice(hosts, spec.nics, nic_names)
        perf = None
        if spec.perf:
            perf = perf_step(spec, engine, checks, routable, servers, problems)
        return CheckReport(checks, nic_names, nic_rows(reports, routable, failures), ranks, problems, warnings,
                           np=requested_np(opts, hosts, source.default_np), source=source.reason, perf=perf,
                           ps_rows=ps_rows)
    finally:
        for s in servers.values():
            s.channel.close()
        if engine is not None:
            engine.close()


def ps_step(spec: LaunchSpec, shape: JobShape, ranks, checks: list[HostCheck], nics: tuple[str, ...], engine,
            problems: list[str]) -> list[tuple]:
    """`--check --tf-cluster`: the roles placed as the launch places them, each host's ports (its table rows),
    and every host reaching every ps on its port (problems appended), at the addresses a launch gives them
    (plan/planner.host_addresses, the hosts by name as the check reached them). `engine`: None for a
    one-machine job (checked in this process); a job mixing this machine with remote hosts lists the ports only."""
    import socket

    from trainrun.check.ps_ports import port_rows, ps_targets, reach_problems
    from trainrun.plan.planner import host_addresses, named_routes, tf_workers
    from trainrun.plan.roles import place_roles

    facts = {c.host: c.facts for c in checks}
    try:
        assert spec.plan.tf_cluster is not None  # ps_step runs for --tf-cluster only
        tasks = place_roles(spec.plan.tf_cluster, [a.host.name for a in ranks])
    except UsageError as err:
        problems.append(str(err))
        return []
    names = sorted({a.host.name for a in ranks})
    local = all(c.via == "local" for c in checks)
    remote = not local and engine is not None and all(c.via != "local" for c in checks)
    addresses = host_addresses(shape, facts, named_routes(shape.used, socket.gethostname()), nics)
    workers = tf_workers(ranks, facts, addresses)
    if local or remote:
        pythons = {c.host: c.facts.python for c in checks}
        problems += reach_problems(ps_targets(tasks, ranks, workers), names, engine if remote else None, pythons)
    return port_rows(tasks, ranks, workers)


def perf_step(spec: LaunchSpec, engine, checks: list[HostCheck], routable: list, servers: dict, problems: list[str]):
    """`--perf`: the measurements (check/perf.py) when the job could run and every host is reached through
    the engine; otherwise only the sameness table from the facts, with the reason the rest was skipped."""
    from trainrun.check.perf import run_perf, versions_table
    from trainrun.check.perf_verdict import PerfResult

    facts = {c.host: c.facts for c in checks if c.ok}
    if problems:
        why = "the check found problems (above); fix them first"
    elif any(c.via == "local" for c in checks) or engine is None:
        why = "every host must be reached remotely (list this machine by a remote-reachable name)"
    elif len(checks) > 1 and not routable:
        why = "no NIC routes between all hosts"
    else:
        return run_perf(spec, engine, facts, routable)
    return PerfResult(list(facts), [], versions=versions_table(facts), skipped=[f"measurements: {why}"])
