"""The waiting policy: when a thread of the runtime that has nothing to do but wait may keep its core
(poll), and when it must give it back (sleep) because other work on the host needs it.

Why: polling reacts within microseconds, which is what makes small collectives fast on an idle host;
on a busy host (data-loader workers, other ranks, the framework's threads, other jobs) every
microsecond a waiter polls is taken from a thread that has real work, and a waiter that only
yields (sched_yield) stays runnable and still takes its fair share. MPICH's own MPI_Wait does not
help: it busy-polls in its progress loop (scripts/bench_wait.py: the CPU time of a wait for a peer
2 ms late equals the wait), so "blocking" here means MPI_Test between sleeps, or a condition
variable where another thread of ours completes the wait (completion.Completion.sleep).

Contract (one Policy per session, made at init from the settings' wait_mode, TRAINRUN_WAIT: horovod_env.py
reads it, context.Session holds the Policy and hands it to every engine it makes; nothing here reads the
environment or holds a policy at import):
- `spin(age_s, budget_s)`: may a waiter that has waited `age_s` since its last progress keep
  polling? `decide` says, from the mode and a load sample:
    spin  -- age_s < budget_s (the behaviour before this policy: spin for the budget, then back off);
    block -- only while age_s < FLOOR_S (a wait that short costs less spinning than a sleep's wake-up);
    auto  -- block's answer when the host is oversubscribed (more runnable tasks than cores), else spin's.
- `sleep_s(age_s, cap_s)`: how long to sleep between polls once spin() says no: a sixteenth of the
  age, from MIN_SLEEP_S up to `cap_s` (MAX_SLEEP_S for an MPI request, whose transfer moves only
  while someone polls; ROUND_SLEEP_S for the engine's rounds, which only wait for peers): a late peer
  costs at most ~1/16 of its lateness, and the cap, in extra latency.
- `wait_request(request)`: complete an MPI request (a data transfer) by that rule, with the budget
  TRANSFER_SPIN_S (see there; 2 ms cost a 16 MiB allreduce ~15% on an idle host). In spin mode it is exactly the
  earlier behaviour (SPIN_TESTS MPI_Tests, then MPI_Wait) so TRAINRUN_WAIT=spin is today's A/B baseline.
- `TransferWait(policy, blocked, size).wait(request, nbytes)`: the wait an engine gives its MPI backend
  when it makes it (for a data transfer, which a round has just agreed every rank is in). While nothing
  of this rank computes beside it (a caller's thread, or the background thread once someone is blocked
  on the engine), under auto among more than 2 ranks: the policy's wait_request or `wait_in_mpi`
  (MPICH's MPI_Wait), whichever this rank measured to give the shorter period between transfers of
  that size (runtime/transfer_tuner.py says why both, and why the period); between 2 ranks, and under
  block and spin, wait_request. In the background thread while nobody is blocked (the training loop
  computes beside it), polls that yield the CPU by this policy. The engine's parts get the policy at
  construction too (Engine(policy=session.policy)); nothing swaps a part's wait later (`set_mode` changes the mode the
  parts ask, for a benchmark's same-process A/B).
- The load sample: the running count of /proc/loadavg ("R/T", runnable tasks on the whole host,
  this one included) against the CPUs this process may run on (os.sched_getaffinity), read at most
  every SAMPLE_S (a pread of an open file, a few microseconds). Host-wide: a job pinned to some cores
  of a busy host counts the others' tasks too and gives its core back more often than it must (the
  safe side); in a container that shares the host's /proc this sees the host.
  Where /proc/loadavg cannot be read, auto counts the host as not oversubscribed (spin's behaviour).
Thread-safe without locks: the sample is a pair of floats replaced whole; a race costs one extra read.
"""
from __future__ import annotations

import os
import time
from threading import get_ident as _get_ident

from trainrun.runtime.transfer_tuner import MPI, TransferTuner

MODES = ("auto", "spin", "block")
ENV = "TRAINRUN_WAIT"
SAMPLE_S = 0.1        # how often the host's load is read
FLOOR_S = 30e-6       # every wait may poll this long: shorter than a sleep's wake-up on a busy host
MIN_SLEEP_S = 20e-6   # the first sleep once polling stops
MAX_SLEEP_S = 0.0002  # the longest sleep between MPI_Tests of a data transfer
ROUND_SLEEP_S = 0.001  # the longest sleep of the engine's loops waiting for peers' rounds
TRANSFER_SPIN_S = 0.1  # how long a data transfer's wait may poll on a host with a core to spare: the
                       # round before it agreed that every rank is there, so this wait is for data that
                       # moves only while polled (16 MiB sleep-polled after 2 ms: 4.0 -> 4.7 ms)
SPIN_TESTS = 256      # spin mode's MPI_Tests before MPI_Wait (~100 us: a small op's whole time)
BLOCKED_TESTS = 8     # wait_in_mpi's MPI_Tests (a small op is done by then) before MPI_Wait


def mode_from(value: str | None) -> str:
    """The mode TRAINRUN_WAIT=`value` asks for (unset or empty: auto). Raises ValueError naming the value."""
    mode = (value or "auto").strip().lower()
    if mode not in MODES:
        raise ValueError(f"{ENV}={value!r} is not a waiting mode: use one of {', '.join(MODES)}")
    return mode


def decide(mode: str, age_s: float, budget_s: float, running: int, cores: int) -> bool:
    """Pure rule of `Policy.spin`: True = keep polling, False = give the core back (see the module's contract).
    `running`: runnable tasks on the host (this waiter included); `cores`: CPUs of the host."""
    if age_s < FLOOR_S and mode != "spin":
        return True
    if mode == "block" or (mode == "auto" and running > cores):
        return False
    return age_s < budget_s


def backoff_s(age_s: float, cap_s: float = MAX_SLEEP_S) -> float:
    """Pure rule of `Policy.sleep_s`: a sixteenth of the age, within [MIN_SLEEP_S, cap_s]."""
    return min(cap_s, max(MIN_SLEEP_S, age_s / 16))


class HostLoad:
    """Runnable tasks on the host, from /proc/loadavg, sampled at most every SAMPLE_S."""

    def __init__(self, path: str = "/proc/loadavg"):
        self.cores = len(os.sched_getaffinity(0)) or 1
        self._fd: int | None
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError:
            self._fd = None
        self._at = -SAMPLE_S
        self._running = 0

    def running(self, now: float) -> int:
        if now - self._at >= SAMPLE_S:
            self._at = now
            self._running = self._read()
        return self._running

    def _read(self) -> int:
        if self._fd is None:
            return 0
        try:  # "0.52 0.58 0.59 3/467 12345": the fourth field's numerator
            return int(os.pread(self._fd, 128, 0).split()[3].split(b"/")[0])
        except (OSError, IndexError, ValueError):
            return 0

    def close(self) -> None:
        """Close the file; a later sample reads 0 (not oversubscribed)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class Policy:
    def __init__(self, mode: str = "auto", load: HostLoad | None = None):
        self.mode = mode_from(mode)
        self.load = load or HostLoad()
        self.spins = self.mode == "spin"  # the earlier behaviour, unchanged (callers branch on it)

    def close(self) -> None:
        """The session ended (its engines have shut down): release the load reader."""
        self.load.close()

    def set_mode(self, mode: str) -> None:
        """Switch the mode at run time, from the next wait on (a benchmark's same-process A/B)."""
        self.mode = mode_from(mode)
        self.spins = self.mode == "spin"

    def oversubscribed(self) -> bool:
        """More runnable tasks than cores at the last sample (auto's question)."""
        return self.load.running(time.monotonic()) > self.load.cores

    def spin(self, age_s: float, budget_s: float) -> bool:
        mode = self.mode
        if mode == "auto" and age_s >= FLOOR_S:
            load = self.load
            return decide(mode, age_s, budget_s, load.running(time.monotonic()), load.cores)
        return decide(mode, age_s, budget_s, 0, 1)

    sleep_s = staticmethod(backoff_s)

    def wait_request(self, request, budget_s: float = TRANSFER_SPIN_S) -> None:
        """Complete MPI `request`: poll (MPI_Test) while spin(age, budget_s), then MPI_Test between
        sleeps of sleep_s(age). Spin mode: SPIN_TESTS polls, then MPI_Wait (the earlier behaviour)."""
        test = request.Test
        if self.spins:
            for _ in range(SPIN_TESTS):
                if test():
                    return
            request.Wait()
            return
        for _ in range(8):  # the in-step case of a small op: done before the clock is worth reading
            if test():
                return
        clock = time.monotonic
        start = clock()
        spin, sleep = self.spin, time.sleep
        while not test():
            age = clock() - start
            if age >= FLOOR_S and not spin(age, budget_s):  # (under the floor every mode polls)
                sleep(backoff_s(age))


def wait_in_mpi(request) -> None:
    """Complete MPI `request` in MPICH's MPI_Wait (its progress loop in C, the GIL released) after
    BLOCKED_TESTS MPI_Tests (a small op is done by then: MPI_Wait returns ~2 us late on those)."""
    test = request.Test
    for _ in range(BLOCKED_TESTS):
        if test():
            return
    request.Wait()


class TransferWait:
    """How the engine's data transfers wait for their MPI request: `wait` is given to the backend when it
    is made (backends.mpi.MPIBackend(comm, wait)), the same for the engine's life.

    In a caller's thread (it drives because it waits: nothing of this rank computes meanwhile), under
    auto among more than 2 ranks, the policy's wait_request or wait_in_mpi, whichever its TransferTuner
    measured to give the shorter period between transfers of that size; else wait_request. In the
    engine's background thread (`bind_background`, once, from that thread), which overlaps the training
    loop, it gives the CPU back between polls while nobody waits on the engine (`blocked()` is 0), so the
    transfer does not take a core from this rank's compute: it yields while the policy lets it spin
    (TRANSFER_SPIN_S: under auto, only while the host has a core to spare), then sleeps (spin mode: it
    only yields, as before); once someone blocks on the engine, the caller's wait."""

    def __init__(self, policy: Policy, blocked, size: int):
        """`size`: the ranks of the engine's communicator (the tuner serves more than 2)."""
        self._policy = policy
        self._blocked = blocked      # () -> callers blocked in the engine (its request queue's drivers)
        self._background: int | None = None  # the background thread's id (bind_background)
        self._tuner = TransferTuner() if size > 2 else None
        self._ended: dict[int, float] = {}  # size class -> when its last measured transfer ended

    def _caller_wait(self, request, nbytes: int) -> None:
        """A transfer nothing of this rank computes beside: under auto among more than 2 ranks, the way the
        tuner measured better for its size (transfer_tuner.py: the policy's sleeps, or MPI_Wait); else the
        policy's wait (2 ranks: one exchange, which a sleep delays once; MPI_Wait measured no faster)."""
        policy = self._policy
        if self._tuner is None or policy.mode != "auto":  # (mode asked per wait: set_mode switches it)
            policy.wait_request(request)
            return
        key = nbytes.bit_length()
        way, measuring = self._tuner.choose(key)
        if way == MPI:
            wait_in_mpi(request)
        else:
            policy.wait_request(request)
        if measuring:  # the period since this size's previous transfer ended (transfer_tuner.py: why)
            now, last = time.perf_counter(), self._ended.get(key)
            self._ended[key] = now
            self._tuner.record(key, way, None if last is None else now - last)
        else:
            self._ended.pop(key, None)

    def bind_background(self) -> None:
        """Called by the engine's background thread as it starts: its transfers yield from then on."""
        self._background = _get_ident()

    def wait(self, request, nbytes: int = 0) -> None:
        """Complete MPI `request` (a transfer of `nbytes`) by the rule of the calling thread (see the class)."""
        if _get_ident() != self._background:
            self._caller_wait(request, nbytes)
            return
        policy = self._policy
        start = time.monotonic()
        spins = policy.spins
        while not self._blocked():
            if request.Test():
                return
            if spins:
                os.sched_yield()
                continue
            age = time.monotonic() - start
            if policy.spin(age, TRANSFER_SPIN_S):  # (a transfer moves only while polled: see TRANSFER_SPIN_S)
                os.sched_yield()
            else:
                time.sleep(policy.sleep_s(age))
        self._caller_wait(request, nbytes)  # someone is blocked on the engine: nothing else to run here

