"""`trainrun --check --perf`: measure every link and every host, through the engine that reached them.

Runs after the check (pipeline.py) found the job could run, with the same engine: one
`python -m trainrun.net.linkbench HOST` per host (its channel carries every command; closing it ends the
process and its short-lived listening sockets), then

1. clock offsets: CLOCK_TRIES `time` round trips per host; the one with the shortest round trip counts;
2. compute: COMPUTE_REPS interleaved probes per host, the best counts (load only ever slows a probe down);
   hosts that share a kernel (same boot_id: containers, namespaces) are probed one at a time, the others
   at once; a host under the threshold is probed again before it is named;
3. links: round-robin rounds of disjoint pairs, all pairs of a round at once, every routable NIC in turn;
   per pair and NIC: RTT, then tx and rx for `seconds` each. Before the verdict, what it would name is
   measured again, pair by pair and each pair alone, in up to RETESTS sweeps (like compute's repeated
   probes); the best reading of each direction counts, and each sweep re-reads what the verdict would name
   on the best readings so far (every link of a host under the host rule, every link under the threshold,
   every failed link): a pair slowed by its round's neighbours, or by a moment of load on a shared machine,
   is not a slow link, while a throttled link stays slow through every sweep;
4. the collective: an allreduce over the job's own plan, launched through trainrun itself
   (`python -m trainrun <the check's hosts and options> PYTHON -m trainrun.check.allreduce_bench`).

`--perf-time T` is the budget of the whole step: the link interval is derived from it, and rounds that no
longer fit are skipped (and listed). Without it each direction gets DEFAULT_SECONDS.
"""
from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

from trainrun.check.perf_verdict import (
    COMPUTE_FRACTION,
    VERSION_FIELDS,
    CollectiveSample,
    HostSample,
    LinkSample,
    PerfResult,
    round_robin,
    suspect_pairs,
)
from trainrun.net.choice import usable_names
from trainrun.plan.hosts import format_hosts

if TYPE_CHECKING:
    from trainrun.launchspec import LaunchSpec

DEFAULT_SECONDS = 0.5
CLOCK_TRIES = 5
COMPUTE_REPS = 3
COMPUTE_SECONDS = 0.2
PINGS = 20
RETESTS = 3                                     # sweeps re-measuring alone what the verdict would name
COLLECTIVE_SIZES = (1 << 16, 1 << 20, 1 << 23)   # bytes: 64 KiB, 1 MiB, 8 MiB
COLLECTIVE_ESTIMATE_S = 15.0                    # what the budget keeps for the MPI world's start and run
START_ESTIMATE_S = 3.0                          # starting the host probes
ROUND_OVERHEAD_S = 0.3                          # per round and NIC: connects, RTT pings, answers


class Bench:
    """One host's linkbench, one command at a time (a host is in one pair per round)."""

    def __init__(self, engine, host: str, token: str, timeout: float):
        self.host, self.lock, self.broken = host, threading.Lock(), ""
        self.ch = engine.run_module(host, "trainrun.net.linkbench", host, timeout=timeout)
        self.ch.send((json.dumps({"token": token}) + "\n").encode())
        line = self.ch.readline()
        if not line:
            last = (self.ch.stderr_text().strip().splitlines() or ["no answer"])[-1]
            self.ch.close()
            raise OSError(last)
        first = json.loads(line)
        self.boot_id = first.get("boot_id", "")
        self.listen = first["listen"]

    def call(self, op: dict) -> dict:
        """One command, one answer. After a failure (a timeout) the channel is out of step with its answers,
        so every later call fails at once with the first error."""
        with self.lock:
            if self.broken:
                raise OSError(self.broken)
            try:
                self.ch.send((json.dumps(op) + "\n").encode())
                line = self.ch.readline()
                if not line:
                    raise OSError("linkbench ended")
                return json.loads(line)
            except (OSError, ValueError) as e:
                self.broken = f"{self.host}'s probe: {e or type(e).__name__}"
                raise OSError(self.broken) from None

    def address(self, nic: str) -> tuple[str, int] | None:
        return next(((a, p) for n, a, p in self.listen if n == nic), None)

    def close(self) -> None:
        self.ch.close()


class Progress:
    """One self-overwriting status line on stderr, only when stderr is a terminal."""

    def __init__(self):
        self.tty = sys.stderr.isatty()

    def __call__(self, text: str) -> None:
        if self.tty:
            sys.stderr.write(f"\r\033[Kperf: {text}")
            sys.stderr.flush()

    def done(self) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def versions_table(facts: dict) -> dict:
    """{label: {host: value}} for the sameness table, from each host's --check facts ({host: HostFacts})."""
    return {label: {h: getattr(f, name) for h, f in facts.items()} for label, name in VERSION_FIELDS}


def link_seconds(perf_time: float | None, rounds: int, nics: int, hosts: int, collective: bool = True) -> float:
    """Seconds per direction per pair and NIC: DEFAULT_SECONDS, or what --perf-time leaves for the links once
    the start, the compute probes and (with MPI) the collective have their share. Matches the rule that
    skips a round that no longer fits (measure_links: per round and NIC, 2 x seconds + ROUND_OVERHEAD_S)."""
    if perf_time is None:
        return DEFAULT_SECONDS
    fixed = START_ESTIMATE_S + COMPUTE_REPS * COMPUTE_SECONDS * hosts + (COLLECTIVE_ESTIMATE_S if collective else 0)
    per_round_nic = (perf_time - fixed) / max(1, rounds * nics) * 0.8  # 20% for re-measuring suspects
    return max(0.1, min(3.0, (per_round_nic - ROUND_OVERHEAD_S) / 2))


def run_perf(spec: LaunchSpec, engine, facts: dict, routable: list) -> PerfResult:
    """Measure the hosts of `facts` ({host: HostFacts}, all reached through `engine`) on the `routable` NICs
    (net.nics.RoutableNic). Never raises for a host's failure: it becomes a sample's error or `skipped`."""
    t_start = time.monotonic()
    hosts = list(facts)
    nics = usable_names(routable)
    rounds = round_robin(hosts) if len(hosts) > 1 else []
    collective = spec.plan.mpi != "none"
    perf_time = spec.perf_time
    seconds = link_seconds(perf_time, len(rounds), len(nics), len(hosts), collective)
    reserve = COLLECTIVE_ESTIMATE_S if collective else 0.0
    deadline = t_start + perf_time - reserve if perf_time else None
    result = PerfResult(hosts, nics, versions=versions_table(facts), rounds=len(rounds), seconds_per_direction=seconds,
                        collective_nic=spec.nics.pinned[0] if spec.nics.pinned else "")
    progress = Progress()
    token = secrets.token_hex(16)
    benches: dict[str, Bench] = {}
    try:
        progress(f"starting {len(hosts)} host probe(s)")
        with ThreadPoolExecutor(max_workers=max(1, min(spec.reach.ssh_parallelism, len(hosts)))) as pool:
            started = {h: pool.submit(Bench, engine, h, token, spec.supervision.host_answer) for h in hosts}
            for h, fut in started.items():
                try:
                    benches[h] = fut.result()
                except Exception as e:  # the transport or the module: a finding on that host, not a crash
                    result.skipped.append(f"{h}: the probe did not start ({e or type(e).__name__})")
        mark = lap(result.phases, "start", t_start)
        clocks = measure_clocks(benches)
        mark = lap(result.phases, "clocks", mark)
        result.host_samples = measure_compute(benches, clocks, progress)
        mark = lap(result.phases, "compute", mark)
        result.links = measure_links(benches, rounds, nics, seconds, deadline, progress, result.skipped)
        mark = lap(result.phases, "links", mark)
        if collective:
            progress("allreduce over the job's plan")
            left = None if deadline is None else deadline + reserve - time.monotonic()
            result.collective, result.collective_error = run_collective(spec, max(30.0, left or 120.0))
            lap(result.phases, "collective", mark)
    finally:
        progress.done()
        for b in benches.values():
            b.close()
    result.wall_s = time.monotonic() - t_start
    return result


def lap(phases: dict, name: str, since: float) -> float:
    now = time.monotonic()
    phases[name] = round(now - since, 3)
    return now


def measure_clocks(benches: dict[str, Bench]) -> dict[str, tuple[float, float]]:
    """{host: (offset ms, uncertainty ms)}: host time minus this machine's, at the shortest round trip."""
    def one(b: Bench) -> tuple[float, float]:
        best: tuple[float, float] | None = None
        for _ in range(CLOCK_TRIES):
            t0 = time.time()
            t = b.call({"op": "time"})["t"]
            t1 = time.time()
            if best is None or t1 - t0 < best[1]:
                best = ((t - (t0 + t1) / 2) * 1000, (t1 - t0) * 1000)
        assert best is not None  # CLOCK_TRIES >= 1
        return best[0], best[1] / 2

    with ThreadPoolExecutor(max_workers=max(1, len(benches))) as pool:
        futures = {h: pool.submit(one, b) for h, b in benches.items()}
    out = {}
    for h, f in futures.items():
        try:
            out[h] = f.result()
        except (OSError, ValueError, KeyError):
            pass
    return out


def measure_compute(benches: dict[str, Bench], clocks: dict, progress) -> list[HostSample]:
    """Best of COMPUTE_REPS probes per host (and COMPUTE_REPS more for a host under the threshold)."""
    groups: dict[str, list[Bench]] = {}
    for b in benches.values():
        groups.setdefault(b.boot_id or b.host, []).append(b)
    best: dict[str, dict] = {}
    errors: dict[str, str] = {}

    def probe_group(group: list[Bench]) -> None:
        for b in group:  # one at a time: these hosts share CPUs
            try:
                got = b.call({"op": "compute", "seconds": COMPUTE_SECONDS})
            except (OSError, ValueError) as e:
                errors[b.host] = str(e) or type(e).__name__
                continue
            if got.get("error"):
                errors[b.host] = got["error"]
            elif b.host not in best or got["gflops"] > best[b.host]["gflops"]:
                best[b.host] = got

    def sweep(sel: list[Bench], label: str) -> None:
        by_group = [[b for b in g if b in sel] for g in groups.values()]
        for rep in range(COMPUTE_REPS):
            progress(f"{label} {rep + 1}/{COMPUTE_REPS}")
            with ThreadPoolExecutor(max_workers=max(1, len(by_group))) as pool:
                list(pool.map(probe_group, [g for g in by_group if g]))

    sweep(list(benches.values()), "compute probe")
    if len(best) >= 2:
        import statistics

        med = statistics.median(v["gflops"] for v in best.values())
        slow = [benches[h] for h, v in best.items() if v["gflops"] < COMPUTE_FRACTION * med]
        if slow:
            sweep(slow, "compute probe again for " + ",".join(b.host for b in slow))
    samples = []
    for h in benches:
        off, err = clocks.get(h, (None, None))
        v = best.get(h)
        if v is None:
            samples.append(HostSample(h, None, clock_offset_ms=off, clock_error_ms=err, error=errors.get(h, "no answer")))
        else:
            samples.append(HostSample(h, v["gflops"], v["load1"], v["mem_avail_mib"], v["cpus"], tuple(v["gpus"]),
                                      off, err))
    return samples


def _measure_pair(benches: dict[str, Bench], nic: str, a: str, b: str, seconds: float) -> list[LinkSample]:
    """a -> b and b -> a on `nic`, driven from a's linkbench."""
    target = benches[b].address(nic)
    if target is None:
        return [LinkSample(nic, a, b, None, error=f"{b} does not listen on {nic}"),
                LinkSample(nic, b, a, None, error=f"{b} does not listen on {nic}")]
    try:
        got = benches[a].call({"op": "link", "peer": b, "addr": target[0], "port": target[1], "seconds": seconds,
                               "pings": PINGS})
    except (OSError, ValueError) as e:
        got = {"error": str(e) or type(e).__name__}
    if got.get("error"):
        return [LinkSample(nic, a, b, None, error=got["error"]), LinkSample(nic, b, a, None, error=got["error"])]
    return [LinkSample(nic, a, b, got["tx_mbps"], got["rtt_us"]), LinkSample(nic, b, a, got["rx_mbps"], got["rtt_us"])]


def measure_links(benches: dict[str, Bench], rounds: list, nics: list[str], seconds: float, deadline: float | None,
                  progress, skipped: list[str]) -> list[LinkSample]:
    hosts = [h for h in benches]
    samples: dict[tuple[str, str, str], LinkSample] = {}
    per_round = len(nics) * (2 * seconds + ROUND_OVERHEAD_S)
    for i, pairs in enumerate(rounds, 1):
        pairs = [(a, b) for a, b in pairs if a in benches and b in benches]
        if deadline is not None and time.monotonic() + per_round > deadline:
            skipped.append(f"link round {i}/{len(rounds)} ({', '.join(f'{a}<->{b}' for a, b in pairs)}): "
                           "--perf-time spent")
            continue
        for nic in nics:
            progress(f"links round {i}/{len(rounds)} on {nic} ({len(pairs)} pair(s) at once)")
            with ThreadPoolExecutor(max_workers=max(1, len(pairs))) as pool:
                for got in pool.map(lambda p: _measure_pair(benches, nic, p[0], p[1], seconds), pairs):
                    for s in got:
                        samples[(s.nic, s.src, s.dst)] = s
    for sweep in range(1, RETESTS + 1):
        suspects = suspect_pairs(list(samples.values()), nics, hosts)[: 2 * len(hosts)]
        if not suspects:
            break
        for j, (nic, a, b) in enumerate(suspects, 1):
            if deadline is not None and time.monotonic() + 2 * seconds + ROUND_OVERHEAD_S > deadline:
                left = ", ".join(f"{x}<->{y} on {n}" for n, x, y in suspects[j - 1:])
                skipped.append(f"re-measuring {left} (sweep {sweep}/{RETESTS}): --perf-time spent")
                return list(samples.values())
            progress(f"re-measuring {a}<->{b} on {nic} alone ({j}/{len(suspects)}, sweep {sweep}/{RETESTS})")
            for s in _measure_pair(benches, nic, a, b, seconds):
                samples[(s.nic, s.src, s.dst)] = best_of(samples[(s.nic, s.src, s.dst)], s)
    return list(samples.values())


def best_of(old: LinkSample, new: LinkSample) -> LinkSample:
    """The better of two readings of one direction (a failure never beats a reading), with every reading kept."""
    readings = (old.readings or ((old.mbps,) if old.mbps is not None else ())) + ((new.mbps,) if new.mbps is not None else ())
    best = new if new.mbps is not None and (old.mbps is None or new.mbps > old.mbps) else old
    return replace(best, readings=tuple(round(v, 1) for v in readings))


def launch_argv(spec: LaunchSpec, program: list[str]) -> list[str]:
    """`python -m trainrun` with the check's hosts and options, running `program` (the job's own plan)."""
    opts, reach, sup = spec.plan, spec.reach, spec.supervision
    argv = [sys.executable, "-m", "trainrun", "--prefix", "none", "--mpi", opts.mpi, "--ssh-timeout", str(sup.ssh_timeout)]
    if opts.mpi != "openmpi":  # (the MPI world forms inside mpirun there: config.py refuses the option)
        argv += ["--start-timeout", str(sup.start_timeout)]
    given = spec.given_hosts
    hosts = format_hosts(list(given)) if given is not None else None  # -H or --hostfile's hosts, as -H
    for flag, value in (("-np", opts.num_proc), ("-H", hosts),
                        ("-p", reach.ssh_port), ("-i", reach.ssh_identity_file), ("--ssh-config", reach.ssh_config),
                        ("--python", reach.python), ("--network-interface", ",".join(spec.nics.pinned) or None),
                        ("--exclude", str(opts.exclude) or None), ("--gpus-per-proc", opts.gpus_per_proc)):
        if value is not None:
            argv += [flag, str(value)]
    for flag, on in (("--oversubscribe", opts.oversubscribe), ("--ssh-strict", reach.ssh_strict),
                     ("--allow-gpu-sharing", opts.allow_gpu_sharing)):
        if on:
            argv.append(flag)
    return argv + program


def run_collective(spec: LaunchSpec, timeout: float) -> tuple[list[CollectiveSample], str]:
    """Launch the allreduce benchmark over the job's plan; (samples, "") or ([], why not)."""
    python = spec.plan.python or sys.executable
    argv = launch_argv(spec, [python, "-m", "trainrun.check.allreduce_bench", *map(str, COLLECTIVE_SIZES)])
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return [], f"the allreduce did not finish in {timeout:.0f} s"
    for line in r.stdout.splitlines():
        if line.startswith("TRAINRUN_PERF "):
            doc = json.loads(line.split(" ", 1)[1])
            return [CollectiveSample(**s) for s in doc["sizes"]], ""
    last = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
    return [], f"the allreduce failed: {last}"
