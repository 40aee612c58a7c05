"""Job: run a LaunchPlan's rank groups to the end: start them, stream output, fail fast, forward
signals, take stacks, clean up.

States (`Job.state`, supervisor/jobstate.py): starting -> running -> stopping (first failure or a signal:
SIGTERM to every rank) -> killing (SIGKILL after `grace` seconds) -> done (every rank reported). A second
Ctrl-C skips the grace period. Callers that need the loop's time register a tick hook (`on_tick`). When the
loop ends, every group is SIGKILLed whatever happened (grandchildren of ranks included, and processes of the job
that left their groups), and a watchdog does the same if the launcher is killed.

Exits: which end of a rank is a failure, which ends the job, which starts the rank again is the verdict of the
Job's ExitPolicy (exit_policy.py: StaticPolicy by default; an elastic attempt's, elasticjob/attempt.py; a parameter-server
job's, ps_policy.py); the Job carries it out. The policy never changes the Job: its state changes in `_on` only.

Stacks: SIGUSR1 to the launcher, a rank's StallError or stuck report, or `hang_timeout` seconds without
output, PMI traffic or runtime progress from any rank make every group take its running ranks' stacks
(dump()); they are printed grouped by identical stack (diag/stack_report.py) and written to `output_dir`. The
job goes on after SIGUSR1; after a hang timeout it fails with exit code 124.

Stalls: a rank's StallError (some ranks did not submit a collective within the stall timeout: spinning,
blocked in a DataLoader, sleeping) or stuck report (it waited the stall timeout while no collective round
completed: a peer's engine takes no part at all, e.g. stopped or exited) (`on_stall`, runtime/rankhook.py)
means nothing inside the ranks can end the wait: the raising ranks may even hang in their own shutdown,
whose MPI_Finalize waits for the absent rank. The stacks are taken, then the job fails (exit 1) naming
the absent ranks by their exit, their /proc state or their stack (supervisor/stall.py), and teardown's
SIGTERM and SIGKILL after `grace` end every rank, stuck or not. After a StallError only, the job waits
STALL_RECOVER_S more once the stacks are in: a program may catch the error and go on (Horovod's stalls
are warnings), and a collective completed by a raising rank in that time means it did; the job goes on. Teardown sends SIGCONT after SIGTERM, so that a
stopped rank ends at once rather than at the SIGKILL after the grace period.

The exit code is the first failing rank's by time across hosts (128+N if signal N killed it, result.py);
128+N if the launcher was interrupted by signal N with no rank failing first; else 0.
"""
from __future__ import annotations

import os
import selectors
import signal
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainrun import log
from trainrun.plan.spec import LaunchPlan
from trainrun.rankset import describe_ranks
from trainrun.supervisor.exit_policy import Done, ExitPolicy, Ignore, RankExit, Restart, StaticPolicy
from trainrun.supervisor.groups import ExitInfo
from trainrun.supervisor.jobstate import JobEvent, JobState, advance
from trainrun.supervisor.result import Failure, JobResult, exit_code_of, left_while, named_rank, settle, signame
from trainrun.supervisor.watchdog import Watchdog

if TYPE_CHECKING:  # the seam, for readers and type checkers; not imported at run time
    from trainrun.diag.stacks import RankStack
    from trainrun.mpiworld.world import MpiWorld
    from trainrun.supervisor.groups import RankGroup
    from trainrun.supervisor.job_output import JobOutput
    from trainrun.supervisor.stall import Stuck
    from trainrun.supervisor.straggler import Watch

TICK = 0.05
KILL_WAIT = 5.0  # seconds after SIGKILL before giving up on hosts that do not answer
DUMP_WAIT = 15.0  # seconds for every host's stacks before printing those that came
HANG_EXIT = 124  # as timeout(1)
STALL_RECOVER_S = 4.0  # after a StallError's stacks: time for a raising rank to show progress again (its
                       # runtime reports progress once a second) before the job fails


class _Dump:
    def __init__(self, reason: str, waiting: set[int], running: list[int], then: Callable[[list[RankStack]], None] | None):
        """`then`: called with the stacks once printed, unless every rank ended meanwhile (it fails the job)."""
        self.reason, self.waiting, self.running, self.then = reason, waiting, running, then
        self.stacks: list[RankStack] = []
        self.deadline = time.monotonic() + DUMP_WAIT


class Job:
    """Owns the job's rank groups (RankGroup: local ranks, agents of remote hosts, mpirun) until every
    rank has been reported; the RankEvents sink of all of them."""

    def __init__(self, plan: LaunchPlan, sink: JobOutput, groups: list[RankGroup], *, grace: float = 3.0,
                 start_timeout: float = 120.0, hang_timeout: float | None = None, output_dir: str | None = None,
                 policy: ExitPolicy | None = None):
        """`groups` must together hold every rank of `plan` exactly once. `policy`: how the ranks' exits are
        judged (exit_policy.py); StaticPolicy when None."""
        self.plan = plan
        self.sink = sink
        self.grace = grace
        self.groups = groups
        self.result = JobResult()
        self.start_timeout = start_timeout
        self.hang_timeout = hang_timeout
        self.output_dir = output_dir
        self.world: MpiWorld | None = None  # made when the first rank speaks PMI (programs without MPI never pay)
        self.state = JobState.STARTING  # changed only by _on (jobstate.py has the transitions)
        self._stopped_at: float | None = None  # wall clock when the stop was asked, for ordering failures
        self._killed_at: float | None = None   # wall clock of our first SIGKILL
        self._stop_deadline = float("inf")     # STOPPING: SIGKILL at this monotonic time
        self._kill_deadline = float("inf")     # KILLING: hosts not reported by then are given up on
        self._stop_others_at = float("inf")    # a verdict's delayed stop (exit_policy.py: stop_others_in)
        self._tick_hooks: list[Callable[[float], None]] = []
        self.batch_time = time.time()  # RankEvents: when the loop woke for the events it dispatches
        self._failures: list[Failure] = []
        self._specs = {p.rank: p for p in plan.procs}
        self._group_of = {s.rank: g for g in groups for s in g.specs}
        self._last_activity = time.monotonic()
        self._dumps: dict[int, _Dump] = {}
        self._dump_seq = 0
        self._requests: dict[int, tuple[int, int]] = {}  # request id -> (dump, index of the group asked)
        self._stuck: list[Stuck] = []  # ranks that waited in a collective no round of which completed
        self._stall_verdict: tuple[float, list[RankStack]] | None = None  # StallError: (fail at, the stacks)
        self.policy: ExitPolicy = policy if policy is not None else StaticPolicy()
        # who holds the job back (supervisor/straggler.py), from the ranks' window summaries: made at first use
        # (`stragglers`), so a job whose ranks send none does not import it (nor statistics)
        self._straggler_hosts = {p.rank: p.host for p in plan.procs} if len(plan.procs) > 1 else None
        self._stragglers: Watch | None = None

    @property
    def stragglers(self) -> Watch | None:
        """The job's straggler Watch (None for a single rank, or once it failed); made when first asked for (a
        window summary, --monitor/--json attaching to it)."""
        if self._stragglers is None and self._straggler_hosts is not None:
            from trainrun.supervisor.straggler import Watch

            self._stragglers = Watch(self._straggler_hosts)
        return self._stragglers

    @stragglers.setter
    def stragglers(self, watch: Watch | None) -> None:
        self._stragglers = watch
        if watch is None:  # stopped diagnosing: not made again
            self._straggler_hosts = None

    def on_tick(self, hook: Callable[[float], None]) -> None:
        """Call `hook(now)` (monotonic seconds) from the loop every TICK or sooner, after the groups' ticks,
        until every rank has been reported. Hooks run in the order registered."""
        self._tick_hooks.append(hook)

    def _on(self, event: JobEvent) -> bool:
        """The one place the state changes; True if `event` changed it."""
        new = advance(self.state, event)
        if new is self.state:
            return False
        self.state = new
        return True

    @property
    def world_formed(self) -> bool:
        """Every rank of the job initialized its MPI world (PMI)."""
        return self.world is not None and len(self.world.initialized) == len(self.plan.procs)

    def _where(self, rank: int) -> str:
        a = self._specs[rank].assignment
        if self.plan.job.tf_tasks:  # a parameter-server job: its role names it best
            t = self.plan.job.tf_tasks[rank]
            return f"{t.role} {t.index} (rank {rank} on {a.host})"
        return f"rank {rank} on {a.host} (local rank {a.local_rank})"

    def fail(self, exit_code: int, what: str, rank: int | None = None, at: float | None = None,
             oom: str | None = None) -> None:
        """Record a failure and stop everything."""
        self._record(exit_code, what, rank, at, oom)
        self.stop()

    def _record(self, exit_code: int, what: str, rank: int | None = None, at: float | None = None,
                oom: str | None = None) -> None:
        """Record a failure. Which failure was first is settled by time at the end; the exit code is set now
        so that an interrupted teardown still reports one."""
        tail = tuple(self.sink.stderr_tail(rank)) if rank is not None else ()
        self._failures.append(Failure(exit_code, what, rank, tail, time.time() if at is None else at, oom))
        if self.result.failure is None and not self.state.stop_asked:
            self.result.failure = self._failures[-1]
            self.result.exit_code = exit_code

    # RankEvents, called from the loop
    def on_output(self, rank: int, stream: int, data: bytes) -> None:
        self._last_activity = time.monotonic()
        self.sink.feed(rank, stream, data)
        if self.sink.broken and self.result.interrupted_by is None:
            self._on_signal(signal.SIGPIPE)  # nobody reads our output any more: end the job as SIGPIPE would

    def on_exit(self, rank: int, returncode: int, info: ExitInfo | None = None) -> None:
        """A rank ended: its policy's verdict (exit_policy.py), carried out."""
        self.result.returncodes[rank] = returncode
        log.info("rank %d exited with %d", rank, returncode)
        ended = self._rank_exit(rank, returncode, info)
        verdict = self.policy.on_exit(ended)
        if isinstance(verdict, Ignore):
            if verdict.stop_others_in is not None:
                self._stop_others_at = min(self._stop_others_at, ended.at + verdict.stop_others_in)
        elif isinstance(verdict, Done):
            log.info("rank %d's end completes the job: stopping the ranks still running", rank)
            self.stop()
        elif isinstance(verdict, Restart):
            self.sink.write_raw(2, (verdict.line + "\n").encode())
            self._group_of[rank].restart(rank, verdict.restart_count)
        else:  # Fail
            how = f"{ended.how} {verdict.note}" if verdict.note else ended.how
            self._record(exit_code_of(returncode), f"{self._where(rank)} {how}", rank, info.at if info else None,
                         info.oom if info else None)
            if verdict.stop_others_in > 0:  # the others may fail on their own meanwhile (a shared cause)
                self._stop_others_at = min(self._stop_others_at, ended.at + verdict.stop_others_in)
            else:
                self.stop()

    def _rank_exit(self, rank: int, returncode: int, info: ExitInfo | None) -> RankExit:
        """What a policy is told of a rank's end."""
        ours = {-signal.SIGTERM: self._stopped_at, -signal.SIGKILL: self._killed_at}.get(returncode)
        # stopped by us, unless it was killed before we sent that signal (a failure, reported late)
        by_us = ours is not None and (info is None or info.at + info.error >= ours)
        how = f"exited with code {returncode}" if returncode >= 0 else f"was killed by {signame(-returncode)}"
        if info is not None and info.oom:
            how += " (out of memory)" if info.oom.startswith("out of memory") else " (probably out of memory)"
        tail = self.sink.stderr_tail(rank)
        return RankExit(rank, returncode, str(self._specs[rank].assignment.host), how, time.monotonic(),
                        tail[-1].strip() if tail else "", self.state, by_us, self.world_formed,
                        self.result.failure is not None)

    def on_pmi(self, rank: int, data: bytes) -> None:
        self._last_activity = time.monotonic()
        if self.world is None:
            from trainrun.mpiworld.world import MpiWorld

            self.world = MpiWorld(self.plan, self.start_timeout)
        replies, problem = self.world.feed(rank, data, time.monotonic())
        for r, line in replies:
            self._group_of[r].pmi_send(r, line)
        if problem is not None:
            where = f"{self._where(problem.rank)} " if problem.rank is not None else ""
            self.fail(problem.exit_code, where + problem.message, problem.rank)

    def on_host_lost(self, host: str, message: str) -> None:
        self.policy.on_host_down(host, self.state, self.result.failure is not None)
        self.fail(255, message)

    def on_host_failed(self, host: str, message: str, exit_code: int) -> None:
        self.policy.on_host_down(host, self.state, self.result.failure is not None)
        self.fail(exit_code, f"{host}: {message}")

    def on_progress(self, rank: int, perf: str = "") -> None:
        self._last_activity = time.monotonic()
        if self._stuck and not perf and any(s.rank == rank and s.absent is not None for s in self._stuck):
            self._recovered(rank)  # (a perf line is a window summary, not news of a completed collective)
        if perf and self.stragglers is not None and not self.state.stop_asked:
            try:
                for line in self.stragglers.on_window(rank, perf, self._last_activity):
                    log.warning("%s", line)
                if self.output_dir:
                    self._record_window(self.stragglers, self.output_dir, rank, perf)
            except Exception as err:  # a diagnosis must never end the job: stop diagnosing
                log.info("straggler detection stopped: %s: %s", type(err).__name__, err)
                self.stragglers = None

    @staticmethod
    def _record_window(watch: Watch, output_dir: str, rank: int, perf: str) -> None:
        """Append the window to --output-dir's straggler.jsonl (per rank and window; supervisor/straggler.py)."""
        line = watch.record(rank, perf, time.time())
        if line is None:
            return
        try:
            os.makedirs(output_dir, exist_ok=True)
            with open(os.path.join(output_dir, "straggler.jsonl"), "a") as f:
                f.write(line + "\n")
        except OSError as err:
            log.info("cannot write %s/straggler.jsonl: %s", output_dir, err.strerror)

    def on_stall(self, rank: int, notice: str) -> None:
        """A rank's runtime says it waits in a collective that cannot complete (supervisor/stall.py):
        take the stacks, then fail the job naming the absent ranks."""
        from trainrun.supervisor.stall import Stuck

        report = Stuck.parse(rank, notice)
        if report is None or any(s.rank == rank for s in self._stuck):
            return
        log.info("rank %d waited %gs in %s (%s)", rank, report.seconds, report.waiting, notice.split(" ", 1)[0])
        self._stuck.append(report)
        if len(self._stuck) == 1 and not self.state.stop_asked:
            self.dump(f"rank {rank} waited {report.seconds:g} s in {report.waiting}"
                      + (", no collective round completing" if report.absent is None else
                         f", which {describe_ranks(report.absent)} did not submit"), then=self._after_stall_stacks)

    def _recovered(self, rank: int) -> None:
        """A rank that raised a StallError completed a collective since: the program went on (caught
        it, and the absent rank came back), so the stall is over."""
        log.info("rank %d made progress after its StallError: the job goes on", rank)
        self._stuck.clear()
        self._stall_verdict = None

    def _after_stall_stacks(self, stacks: list[RankStack]) -> None:
        """The stacks are in: a stuck report fails the job now, a StallError after STALL_RECOVER_S."""
        if not self._stuck:  # recovered while the stacks were taken
            return
        if any(s.absent is None for s in self._stuck):
            self._fail_stuck(stacks)
        else:
            self._stall_verdict = (time.monotonic() + STALL_RECOVER_S, stacks)

    def _fail_stuck(self, stacks: list[RankStack]) -> None:
        from trainrun.diag.stack_report import in_trainrun_call
        from trainrun.supervisor.stall import STALL_EXIT, describe

        states = {s.rank: s.state for s in stacks if s.state}
        in_call = {s.rank for s in stacks if in_trainrun_call(s)}
        message, rank = describe(self._stuck, sorted(self._specs), self.result.returncodes, states, self._where, in_call)
        self.fail(STALL_EXIT, message, rank)

    def on_stacks(self, request: int, stacks: list[RankStack]) -> None:
        asked = self._requests.pop(request, None)
        d = self._dumps.get(asked[0]) if asked is not None else None
        if asked is None or d is None:
            return  # too late: printed without them
        group = asked[1]
        d.stacks += stacks
        d.waiting.discard(group)

    # stacks
    def dump(self, reason: str, then: Callable[[list[RankStack]], None] | None = None) -> None:
        """Ask every group with running ranks for their stacks; printed when all have answered, then
        given to `then` (see _Dump)."""
        self._dump_seq += 1
        live = [i for i, g in enumerate(self.groups) if g.running]
        running = sorted(s.rank for i in live for s in self.groups[i].specs if s.rank not in self.result.returncodes)
        self._dumps[self._dump_seq] = _Dump(reason, set(live), running, then)
        use_py_spy = os.environ.get("TRAINRUN_PY_SPY", "1").lower() not in ("0", "off", "no")
        for i in live:
            request = len(self._requests) + 1000 * self._dump_seq
            self._requests[request] = (self._dump_seq, i)
            self.groups[i].dump(request, use_py_spy)
        log.info("stack dump %d (%s) asked of %d group(s)", self._dump_seq, reason, len(live))

    def _check_dumps(self, now: float, final: bool = False) -> None:
        """Print the dumps every group has answered (or whose time is up; all of them if `final`)."""
        for seq, d in list(self._dumps.items()):
            if d.waiting and now < d.deadline and not final:
                continue
            del self._dumps[seq]
            from trainrun.diag.stack_report import render, write_dumps

            got = {s.rank for s in d.stacks}
            stacks = sorted(d.stacks, key=lambda s: s.rank)
            text = render(stacks, d.reason, [r for r in d.running if r not in got])
            if self.output_dir:
                try:
                    write_dumps(self.output_dir, stacks, seq)
                    text += f"trainrun: full dumps in {self.output_dir}/rank.N/stacks.{seq}.txt\n"
                except OSError as err:
                    text += f"trainrun: cannot write the dumps to {self.output_dir}: {err.strerror}\n"
            self.sink.write_raw(2, text.encode())
            if d.then is not None and not final:
                d.then(stacks)
        if not self._dumps and self._on(JobEvent.DUMP_DONE):  # a stop was pending: it happens now
            self._send_stop()

    def _fail_hung(self, stacks: list[RankStack]) -> None:
        self.fail(HANG_EXIT, f"no output and no runtime progress from any rank for {self.hang_timeout:g}s "
                             "(--hang-timeout); stacks above")

    def _on_signal(self, sig: int) -> None:
        if sig == signal.SIGUSR1:
            self.dump("SIGUSR1")
            return
        if self.result.interrupted_by is not None and sig == signal.SIGINT:
            log.info("second interrupt: killing now")
            self._kill(wait=1.0)
            return
        if self.result.interrupted_by is None:
            self.result.interrupted_by = sig
            if self.result.failure is None:
                self.result.exit_code = 128 + sig
        self.stop()

    def stop(self) -> None:
        """Begin teardown: SIGTERM to every rank now (or once a stack dump in progress is complete: the
        stacks of a failing job are the ones wanted), SIGKILL after the grace period."""
        if not self._on(JobEvent.STOP_AFTER_DUMP if self._dumps else JobEvent.STOP):
            return
        self._stopped_at = time.time()
        if self.state is JobState.STOP_PENDING:
            log.info("stopping all ranks once the stacks are taken")
            return
        self._send_stop()

    def _send_stop(self) -> None:
        log.info("stopping all ranks (grace %.1fs)", self.grace)
        self._stop_deadline = time.monotonic() + self.grace
        for g in self.groups:
            g.signal(signal.SIGTERM)
            g.signal(signal.SIGCONT)  # a stopped rank: its SIGTERM takes effect now, not at the SIGKILL

    def _kill(self, wait: float = KILL_WAIT) -> None:
        """SIGKILL everything; hosts that have not reported `wait` seconds later are given up on."""
        self._on(JobEvent.KILL)
        self._kill_deadline = min(self._kill_deadline, time.monotonic() + wait)
        self._sigkill()

    def _sigkill(self) -> None:
        self._killed_at = self._killed_at or time.time()
        for g in self.groups:
            g.kill()

    def _ended(self, rank: int) -> str:
        """How a rank that left the runtime ended: "exited 0", or "left" when trainrun stopped it."""
        rc = self.result.returncodes.get(rank)
        return f"exited {rc}" if rc is not None and rc >= 0 else "left"

    def _settle(self) -> None:
        """The first failure by time, and its exit code; the rest as consequences."""
        # the tails are complete now that every stream has ended (settle reads them: a rank may name the cause)
        fresh = lambda f: f if f.rank is None else Failure(f.exit_code, f.what, f.rank, tuple(self.sink.stderr_tail(f.rank)), f.at, f.oom)  # noqa: E731
        failures = [fresh(f) for f in self._failures]
        trigger = next((g for f, g in zip(self._failures, failures) if f is self.result.failure), None)
        first, later = settle(failures, self._stopped_at, trigger)
        if first is None:
            return
        named, via = named_rank(first), first
        unfailed = lambda r: r in self._specs and all(f.rank != r for f in failures)  # noqa: E731
        seen = {first.rank}
        while named is not None and unfailed(named[0]) and named[0] not in seen:
            # the named rank's own error may name another (rank 2 <- rank 0's abort <- rank 1 left): the root
            hop = Failure(0, "", named[0], tuple(self.sink.stderr_tail(named[0])))
            further = named_rank(hop)
            if further is None or further[0] in seen or not unfailed(further[0]):
                break
            seen.add(named[0])
            named, via = further, hop
        if named is not None and unfailed(named[0]):
            # the rank the others' errors name was still exiting when trainrun stopped the job: not a
            # failure of its own record, but the cause; its stderr shows what it raised
            rank, reason = named
            left = left_while(via)
            what = f"{self._where(rank)} {self._ended(rank)} {left[1]}" if left else f"{self._where(rank)} stopped: {reason}"
            cause = Failure(first.exit_code, what, rank, tuple(self.sink.stderr_tail(rank)), first.at)
            first, later = cause, [first, *later]
        elif first.rank is not None:
            # a rank that failed on its own while others waited for it in a collective: say so (their
            # errors name it, whether they failed too or trainrun stopped them)
            tails = (Failure(0, "", r, tuple(self.sink.stderr_tail(r))) for r in sorted(self._specs) if r != first.rank)
            left = next((lw for f in tails if (lw := left_while(f)) and lw[0] == first.rank), None)
            if left:
                first = Failure(first.exit_code, f"{first.what} {left[1]}", first.rank, first.stderr_tail, first.at, first.oom)
        self.result.failure = first
        self.result.consequences = later
        self.result.exit_code = first.exit_code

    def run(self) -> JobResult:
        sel = selectors.DefaultSelector()
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        caught = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
        old_handlers = {s: signal.signal(s, lambda *_: None) for s in caught}
        old_wakeup = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        def on_wake() -> None:  # the signal numbers the handlers' wakeup fd wrote
            for sig in wake_r.recv(64):
                self._on_signal(sig)

        sel.register(wake_r, selectors.EVENT_READ, on_wake)
        watchdog = Watchdog()
        try:
            for g in self.groups:
                g.start(sel, watchdog, self)
            self._on(JobEvent.STARTED)
            self._last_activity = time.monotonic()
            while any(g.running for g in self.groups):
                ready = sel.select(TICK)
                self.batch_time = time.time()
                for key, _ in ready:
                    key.data()
                now = time.monotonic()
                for g in self.groups:
                    g.tick(now)
                self.policy.tick(now)
                if now >= self._stop_others_at:  # a verdict's delayed stop (exit_policy.py)
                    self._stop_others_at = float("inf")
                    self.stop()
                for hook in self._tick_hooks:
                    hook(now)
                self.sink.tick()
                if self._dumps:
                    self._check_dumps(now)
                if self.world is not None and (problem := self.world.check_start(now)):
                    self.fail(problem.exit_code, f"MPI world incomplete: {problem.message}")
                if (self.hang_timeout and not self.state.stop_asked and not self._dumps
                        and now - self._last_activity > self.hang_timeout):
                    log.info("no activity for %.0fs: taking stacks, then ending the job", now - self._last_activity)
                    self.dump(f"no output or progress for {self.hang_timeout:g}s", then=self._fail_hung)
                if self._stall_verdict is not None and now >= self._stall_verdict[0]:
                    stacks, self._stall_verdict = self._stall_verdict[1], None
                    if self._stuck and not self.state.stop_asked:
                        self._fail_stuck(stacks)
                if self.state is JobState.STOPPING and now >= self._stop_deadline:
                    log.info("grace period over: SIGKILL")
                    self._kill()
                if self.state is JobState.KILLING and now >= self._kill_deadline:
                    for g in self.groups:
                        g.abandon()
        finally:
            if self._dumps:  # every rank ended meanwhile: show what came
                self._check_dumps(time.monotonic(), final=True)
            self._sigkill()  # leftovers: children of ranks, ranks never reported (a sweep, not a transition)
            for g in self.groups:
                g.close(sel)
            for g in self.groups:
                g.wait_closed()
            for g in self.groups:  # lost hosts: what their cleanup over a fresh connection came to
                if g.cleanup_note:
                    self.result.notes.append(g.cleanup_note)
                    self.result.may_still_run += g.may_still_run
            watchdog.close()
            if self.world is not None:
                self.world.cleanup()
            self.sink.close()
            if self._straggler_hosts is not None:  # a Watch was made, or would have been (not one that failed)
                try:
                    # (never made: no window came and nothing attached to it, so its summary is empty)
                    for line in self._stragglers.summary() if self._stragglers is not None else ():
                        log.warning("%s", line)
                    if self.output_dir:  # DIR/straggler.html from the windows recorded
                        from trainrun.supervisor.straggler_plot import write_plot

                        write_plot(self.output_dir)
                except Exception as err:  # (as in on_progress)
                    log.info("straggler summary failed: %s: %s", type(err).__name__, err)
            self._settle()
            self._on(JobEvent.ENDED)
            signal.set_wakeup_fd(old_wakeup)
            for s, h in old_handlers.items():
                signal.signal(s, h)
            sel.close()
            wake_r.close()
            wake_w.close()
        return self.result
