"""LocalRanks: start and own the ranks of one host, on the machine this code runs on.

A RankGroup (groups.py). Used by the launcher for its own host and by the agent (trainrun.agent) on
every remote host, so local and remote ranks behave the same. Each rank runs in its own session (process group = its pid), its
stdout/stderr are pipes, its exit is watched with a pidfd, and, when the MPI world is on, it gets a
PMI-1 socket (PMI_FD). Everything is reported to the `RankEvents` sink given to `start` from the owner's selector loop.

Each rank also gets a *diag pipe* (TRAINRUN_DIAG_FD, see runtime/rankhook.py): its runtime announces its
faulthandler file there and reports progress and stalls. `dump()` takes the running ranks' stacks in a
thread (py-spy or that faulthandler, diag/stacks.py) and reports them from the loop. Exits are reported
with the wall-clock time they were reaped and, for a SIGKILL, the OOM verdict (oom.py).

Cleanup contract: `signal()` reaches each live rank's whole process group; `kill()` SIGKILLs every
group the ranks ever had, then the whole tree below the ranks and below the orphans of the job this
process adopted (it makes itself a child subreaper at `start`, so a double-forked `env -i` daemon stays
its child; reaper.py), then every process of the job on this host found by the job's mark in its
environment, until none is left; the Watchdog does the same if the owner dies. Orphans of the job that
end while it runs are reaped (`tick`), so they do not linger as zombies.
"""
from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from trainrun import log
from trainrun.errors import ProgramError
from trainrun.plan.spec import ProcessSpec
from trainrun.supervisor.groups import ExitInfo
from trainrun.supervisor.watchdog import Watchdog

if TYPE_CHECKING:  # the seam, for readers and type checkers; not imported at run time
    from trainrun.diag.stacks import HookInfo
    from trainrun.elasticjob.control import ControlServer
    from trainrun.supervisor.groups import RankEvents
    from trainrun.supervisor.oom import OomWatch
    from trainrun.elasticjob.spares import SparePool

EXIT_LINGER = 0.5  # seconds to wait for a dead rank's pipes (held open by its children) before reporting
REAP_EVERY = 1.0  # seconds between looks for adopted orphans that ended (zombies to reap)


def core_sets() -> list[set[int]]:
    """The CPUs this process may use, grouped by physical core (hyperthreads together)."""
    cores: dict[str, set[int]] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                key = f.read().strip()
        except OSError:
            key = str(cpu)
        cores.setdefault(key, set()).add(cpu)
    return list(cores.values())


def host_env(spec: ProcessSpec, base: dict[str, str], cpus: int) -> dict[str, str]:
    """The rank's full environment: the host's, then trainrun's, then host-side defaults."""
    env = {**base, **spec.env}
    env.setdefault("OMP_NUM_THREADS", str(max(1, cpus // spec.assignment.local_size)))
    # torch's CPU allocator asks for transparent huge pages on allocations >= 2 MiB, as NumPy does for
    # large arrays: MPI's shared-memory copies of a 16 MiB tensor run ~1.3x faster on them
    # (docs/benchmarks/allreduce.md). Set it to 0 to keep torch's default.
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    # `import horovod.torch` gives trainrun's modules: this host's shim dir first on PYTHONPATH (_horovod)
    from trainrun.plan.horovod_shim import rank_env as with_horovod_shim

    return with_horovod_shim(env)


class _Rank:
    def __init__(self, spec: ProcessSpec, proc: subprocess.Popen, pidfd: int, pmi: socket.socket | None, diag: int):
        self.spec, self.proc, self.pidfd, self.pmi = spec, proc, pidfd, pmi
        self.diag: int | None = diag  # None once the rank closed it
        self.open_streams = 2
        self.returncode: int | None = None
        self.exit_deadline = 0.0
        self.exit_info: ExitInfo | None = None
        self.reported = False
        self.hook: HookInfo | None = None  # what its runtime announced on the diag pipe
        self.diag_buf = b""
        self.env: dict[str, str] = {}  # what it was started with (a spare for the next attempt gets its start-up part)


class LocalRanks:
    """The ranks `procs` (all of this host), started as children of this process."""

    def __init__(self, procs: list[ProcessSpec], *, pmi: bool = False, base_env: dict | None = None,
                 control: ControlServer | None = None, spares: SparePool | None = None):
        """`control`: an elastic job's control channels (elasticjob/control.py): each rank gets TRAINRUN_CTL_FD.
        `spares`: an elastic job's warm ranks (elasticjob/spares.py): a rank starts as one of them when one
        matches, and the pool is filled for the next attempt once these ranks train."""
        self.specs = procs
        self.control = control
        self.spares = spares
        self._warmed = spares is None  # the pool was filled for this attempt (or there is none)
        self.warm_starts = 0  # ranks of this attempt that started as a spare
        self.cleanup_note: str | None = None  # (RankGroup: nothing of a host lost; close() reaps every rank)
        self.may_still_run = 0
        self.events: RankEvents | None = None
        self.pmi = pmi
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.ranks: dict[int, _Rank] = {}
        self._pgids: list[int] = []
        # the job's mark on this host (reaper.py): TRAINRUN_JOB_ID and the host names of these ranks
        self._job_id = next((p.env["TRAINRUN_JOB_ID"] for p in procs if "TRAINRUN_JOB_ID" in p.env), None)
        self._hosts = sorted({p.env.get("TRAINRUN_HOSTNAME", p.host) for p in procs})
        self._oom: OomWatch | None = None  # made at start
        self._dumps: list[tuple[int, list]] = []  # finished dumps, handed from their thread to the loop
        self._dump_lock = threading.Lock()
        self._wake: tuple[int, int] | None = None
        self._since = 0  # clock ticks since boot when start() began: the job's processes are younger
        self._helpers: set[int] = set()  # our own children in another session that are not the job's (watchdog)
        self._next_reap = 0.0
        # (sel, watchdog) once started: restart() starts a rank again with them
        self._started: tuple[selectors.BaseSelector, Watchdog] | None = None
        self._retired: list[_Rank] = []  # ranks that were restarted: their old pipes are closed at close()
        self._stacks_dirs: dict[str, str | None] = {}  # host -> the job's stack-file directory there (diag/stack_dir.py)

    @property
    def _report_to(self) -> RankEvents:
        """The events given to start(): ranks (and so reports) exist only after it."""
        assert self.events is not None, "a rank reported before start()"
        return self.events

    def start(self, sel: selectors.BaseSelector, watchdog: Watchdog, events: RankEvents) -> None:
        """Start every rank. Raises ProgramError (after killing those started) if one cannot exec."""
        self.events = events
        from trainrun.supervisor import reaper
        from trainrun.supervisor.oom import OomWatch

        reaper.become_subreaper()
        self._since = reaper.ticks_now()
        self._next_reap = time.monotonic() + REAP_EVERY  # the first look for ended orphans a second in, as every later one
        from trainrun.supervisor.watchdog import guardian_pids

        self._helpers = {watchdog.pid, *guardian_pids()}

        self._oom = OomWatch()
        self._wake = os.pipe()
        os.set_blocking(self._wake[0], False)
        sel.register(self._wake[0], selectors.EVENT_READ, self._on_dump_done)
        if self._job_id:
            watchdog.mark(self._job_id, self._hosts)
        cores = core_sets()
        self._started = (sel, watchdog)
        for spec in self.specs:
            if not os.path.isdir(spec.cwd):
                self.kill()
                raise ProgramError(f"rank {spec.rank} on {spec.host}: working directory {spec.cwd} does not exist there; pass --workdir", exit_code=127)
            if (script := _python_script(spec.argv)) and not os.path.isfile(os.path.join(spec.cwd, script)):
                self.kill()  # as a missing binary is: 127 and one line, not Python's "can't open file" and exit 2
                raise ProgramError(f"rank {spec.rank} on {spec.host}: program {script}: no such file (in {spec.cwd})", exit_code=127)
            try:
                self._start_one(spec, sel, watchdog, cores)
            except OSError as err:
                self.kill()
                raise _exec_error(spec, err) from None
        if self.warm_starts:
            log.info("%d of %d rank(s) on %s started warm", self.warm_starts, len(self.specs), ",".join(self._hosts))

    def restart(self, rank: int, count: int) -> None:
        """Start rank `rank` again, as it was planned (after its end was reported; a parameter-server job's
        worker, supervisor/ps_policy.py); TRAINRUN_RESTART_COUNT=`count` tells it apart. A failure to start it is
        reported as its exit (127)."""
        old = self.ranks[rank]
        self._retired.append(old)
        spec = replace(old.spec, env={**old.spec.env, "TRAINRUN_RESTART_COUNT": str(count)})
        assert self._started is not None, "restart() before start()"
        sel, watchdog = self._started
        try:
            self._start_one(spec, sel, watchdog, core_sets())
        except OSError:
            self._report_to.on_exit(rank, 127)

    def _start_one(self, spec: ProcessSpec, sel, watchdog: Watchdog, cores: list[set[int]]) -> None:
        env = host_env(spec, self.base_env, len(os.sched_getaffinity(0)))
        env = {k: v for k, v in env.items() if not k.startswith("PMI_")}  # an outer launcher's PMI is not ours
        pass_fds: tuple[int, ...] = ()
        child_sock: socket.socket | None = None
        parent_sock: socket.socket | None = None
        if self.pmi:
            from trainrun.mpiworld.pmienv import socket_env

            parent_sock, child_sock = socket.socketpair()
            pass_fds = (child_sock.fileno(),)
            env.update(socket_env(spec.rank, spec.assignment.size, child_sock.fileno()))
        diag_r, diag_w = os.pipe()  # the rank's diag pipe (runtime/rankhook.py): FD:INODE tells it from a reused fd
        os.set_blocking(diag_r, False)
        pass_fds += (diag_w,)
        env["TRAINRUN_DIAG_FD"] = f"{diag_w}:{os.fstat(diag_w).st_ino}"
        if (stacks := self._stacks_dir(spec)) is not None:
            from trainrun.diag.stack_dir import STACKS_DIR_ENV

            env[STACKS_DIR_ENV] = stacks
        ctl_sock = None
        if self.control is not None:
            ctl_sock = self.control.child_end(spec.rank, sel)
            pass_fds += (ctl_sock.fileno(),)
            env["TRAINRUN_CTL_FD"] = str(ctl_sock.fileno())
        cpus = cores[spec.assignment.local_rank % len(cores)] if spec.bind_to == "core" and cores else None
        try:
            proc = self._warm_start(spec, env, pass_fds, cpus)
            if proc is None:
                preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus is not None else None
                proc = subprocess.Popen(
                    spec.argv, cwd=spec.cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, pass_fds=pass_fds, start_new_session=True, preexec_fn=preexec,
                )
        except OSError:
            os.close(diag_r)
            raise
        finally:
            for sock in (child_sock, ctl_sock):
                if sock is not None:
                    sock.close()
            os.close(diag_w)
        watchdog.add(proc.pid)
        self._pgids.append(proc.pid)
        if self._oom is not None:
            self._oom.watch(proc.pid)
        rank = _Rank(spec, proc, os.pidfd_open(proc.pid), parent_sock, diag_r)
        rank.env = env
        self.ranks[spec.rank] = rank
        sel.register(diag_r, selectors.EVENT_READ, lambda: self._read_diag(rank, sel))
        sel.register(proc.stdout, selectors.EVENT_READ, lambda: self._read(rank, 1, proc.stdout, sel))
        sel.register(proc.stderr, selectors.EVENT_READ, lambda: self._read(rank, 2, proc.stderr, sel))
        sel.register(rank.pidfd, selectors.EVENT_READ, lambda: self._reap(rank, sel))
        if parent_sock is not None:
            sel.register(parent_sock, selectors.EVENT_READ, lambda: self._read_pmi(rank, sel))

    def _stacks_dir(self, spec: ProcessSpec) -> str | None:
        """The job's stack-file directory on the rank's host, made with its first rank (close() removes it,
        the Watchdog if this process dies, a lost host's reaper otherwise: diag/stack_dir.py); None without a job id."""
        host = spec.env.get("TRAINRUN_HOSTNAME", spec.host)
        if self._job_id is None:
            return None
        if host not in self._stacks_dirs:
            from trainrun.diag.stack_dir import make_stacks_dir

            self._stacks_dirs[host] = make_stacks_dir(self._job_id, host)
        return self._stacks_dirs[host]

    def _warm_start(self, spec: ProcessSpec, env: dict[str, str], pass_fds: tuple[int, ...],
                    cpus: set[int] | None) -> subprocess.Popen | None:
        """The rank started as a spare from the pool (elasticjob/spares.py), or None: start it cold."""
        spare = self.spares.take(spec.argv, env) if self.spares is not None else None
        if spare is None:
            return None
        from trainrun.wire.spare_handoff import Handoff, fd_env

        handoff = Handoff(spec.argv, spec.cwd, env, None if cpus is None else tuple(sorted(cpus)), fd_env(env, pass_fds))
        try:
            proc = spare.hand(handoff, pass_fds)
        except OSError as err:
            log.info("rank %d: warm rank %d gone (%s); starting it cold", spec.rank, spare.proc.pid, err)
            spare.end()
            return None
        self.warm_starts += 1
        return proc

    def _warm_up(self) -> None:
        """Fill the pool for the next attempt: one spare per rank of this one (once, when they train)."""
        self._warmed = True
        ranks = [(r.spec.argv, r.spec.cwd, r.env) for r in self.ranks.values()]
        if self.spares is not None:
            self.spares.fill(ranks)

    def _read(self, rank: _Rank, stream: int, pipe, sel) -> None:
        data = os.read(pipe.fileno(), 1 << 16)
        self._report_to.on_output(rank.spec.rank, stream, data)
        if not data:
            sel.unregister(pipe)
            pipe.close()
            rank.open_streams -= 1
            self._maybe_report(rank)

    def _read_pmi(self, rank: _Rank, sel) -> None:
        assert rank.pmi is not None  # registered only for a rank with a PMI socket
        try:
            data = rank.pmi.recv(1 << 16)
        except OSError:
            data = b""
        if data:
            self._report_to.on_pmi(rank.spec.rank, data)
        else:
            sel.unregister(rank.pmi)

    def _read_diag(self, rank: _Rank, sel) -> None:
        """Lines from the rank's runtime (runtime/rankhook.py): hook, progress, perf, stall, stuck."""
        if rank.diag is None:
            return
        try:
            data = os.read(rank.diag, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            _close_quietly(sel, rank.diag)
            rank.diag = None
            return
        *lines, rank.diag_buf = (rank.diag_buf + data).split(b"\n")
        for line in lines:
            word, _, rest = line.decode(errors="replace").partition(" ")
            if word == "hook":
                from trainrun.diag.stacks import HookInfo

                pid, ident, path = rest.split(" ", 2)
                rank.hook = HookInfo(int(pid), int(ident), path)
            elif word == "progress":
                self._report_to.on_progress(rank.spec.rank)
                if not self._warmed:  # training: the spares' imports no longer slow the ranks' start
                    self._warm_up()
            elif word == "perf":  # a window summary (wire/perf_line.py): progress too
                self._report_to.on_progress(rank.spec.rank, rest)
            elif word in ("stall", "stuck"):  # passed on whole: supervisor/stall.Stuck.parse reads it
                self._report_to.on_stall(rank.spec.rank, line.decode(errors="replace"))

    def dump(self, request: int, use_py_spy: bool) -> None:
        """Take the stacks of the running ranks in a thread; reported through on_stacks from the loop."""
        from trainrun.diag.stacks import Target, find_py_spy, take_stacks

        targets = [Target(r.spec.rank, r.spec.host, r.proc.pid, r.hook) for r in self.ranks.values() if r.returncode is None]
        py_spy = find_py_spy() if use_py_spy else None

        def work():
            stacks = take_stacks(targets, py_spy) if targets else []
            with self._dump_lock:  # under the lock: close() cannot close the wake pipe meanwhile
                self._dumps.append((request, stacks))
                if self._wake is not None:
                    os.write(self._wake[1], b"x")

        threading.Thread(target=work, name=f"trainrun-dump-{request}", daemon=True).start()

    def _on_dump_done(self) -> None:
        try:
            if self._wake is not None:
                os.read(self._wake[0], 64)
        except OSError:
            pass
        with self._dump_lock:
            done, self._dumps = self._dumps, []
        for request, stacks in done:
            self._report_to.on_stacks(request, stacks)

    def pmi_send(self, rank: int, data: bytes) -> None:
        sock = self.ranks[rank].pmi
        if sock is None:  # no PMI socket (pmi=False): nobody to answer
            return
        try:
            sock.sendall(data)
        except OSError:
            pass  # the rank is gone; its exit is reported separately

    def _reap(self, rank: _Rank, sel) -> None:
        sel.unregister(rank.pidfd)
        os.close(rank.pidfd)
        rank.returncode = rank.proc.wait()
        killed = rank.returncode == -signal.SIGKILL
        oom = self._oom.verdict(rank.proc.pid) if killed and self._oom is not None else None
        rank.exit_info = ExitInfo(self._report_to.batch_time, oom)
        rank.exit_deadline = time.monotonic() + EXIT_LINGER
        self._maybe_report(rank)

    def _maybe_report(self, rank: _Rank, now: float | None = None) -> None:
        if rank.reported or rank.returncode is None:
            return
        if rank.open_streams and (now is None or now < rank.exit_deadline):
            return
        rank.reported = True
        self._report_to.on_exit(rank.spec.rank, rank.returncode, rank.exit_info)

    def tick(self, now: float) -> None:
        """Report exits whose pipes are still held open by a rank's children after EXIT_LINGER; reap the
        job's orphans that ended (every REAP_EVERY s)."""
        for rank in self.ranks.values():
            self._maybe_report(rank, now)
        if now >= self._next_reap and self.ranks:
            self._next_reap = now + REAP_EVERY
            self._reap_orphans()

    def _orphans(self, procs=None) -> list:
        """The job's processes this process adopted (children in a rank's session or one of their own)."""
        from trainrun.supervisor import reaper

        ranks = {r.proc.pid for r in self.ranks.values()}
        spares = self.spares.pids() if self.spares is not None else set()
        return reaper.adopted(os.getpid(), self._since, self._helpers | ranks | spares, procs)

    def _reap_orphans(self) -> None:
        from trainrun.supervisor import reaper

        reaper.reap_adopted(p.pid for p in self._orphans() if p.state in "ZX")

    @property
    def running(self) -> int:
        return sum(1 for r in self.ranks.values() if not r.reported)

    def signal(self, sig: int) -> None:
        """Send `sig` to the process group of every rank that has not exited."""
        for rank in self.ranks.values():
            if rank.returncode is None:
                _killpg(rank.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL every process group the ranks had, the trees below the ranks and the job's adopted
        orphans, then every process of the job on this host carrying its mark, until none is left: nothing
        of the job survives."""
        if not self._pgids:
            return
        from trainrun.supervisor import reaper

        for pgid in self._pgids:
            _killpg(pgid, signal.SIGKILL)
        # a reaped rank's pid may be another process's by now: only unreaped ones (zombies hold their pid)
        roots = {r.proc.pid for r in self.ranks.values() if r.proc.returncode is None} | {p.pid for p in self._orphans()}
        left = reaper.kill_tree(roots, spare=self._helpers | (self.spares.pids() if self.spares is not None else set()))
        if self._job_id:
            left += reaper.sweep(self._job_id, self._hosts)
        if roots:  # (none: every rank was reaped and no orphan adopted, so no process of the job is below this
            self._reap_orphans()  # one any more, and none can come to it: the usual end, one /proc scan less)
        if left:
            log.warning("%d process(es) of job %s on %s survived SIGKILL: %s", len(left), self._job_id,
                        ",".join(self._hosts), sorted(set(left)))

    def close(self, sel: selectors.BaseSelector) -> None:
        """Release pipes and sockets (after kill); reaps ranks that were never reaped."""
        for rank in [*self._retired, *self.ranks.values()]:
            for f in (rank.proc.stdout, rank.proc.stderr, rank.pmi, rank.diag):
                _close_quietly(sel, f)
            if rank.returncode is None:
                _close_quietly(sel, rank.pidfd)
                rank.returncode = rank.proc.wait()
            if rank.hook is not None:  # the rank's faulthandler file, if it could not remove it itself
                try:
                    os.unlink(rank.hook.path)
                except OSError:
                    pass
        # and the stack files of ranks killed before they announced them: every rank is reaped now (the
        # directories exist only for a job with an id)
        if self._stacks_dirs and self._job_id is not None:
            from trainrun.diag.stack_dir import remove_stacks_dir

            for host in self._stacks_dirs:
                remove_stacks_dir(self._job_id, host)
            self._stacks_dirs.clear()
        with self._dump_lock:
            if self._wake is not None:
                _close_quietly(sel, self._wake[0])
                os.close(self._wake[1])
                self._wake = None
        if self._oom is not None:
            self._oom.close()
        if self.control is not None:
            self.control.release(sel)

    def wait_closed(self) -> None:
        """Nothing to wait for: close() reaped every rank."""

    def abandon(self) -> None:
        """Local ranks always report after SIGKILL: nothing to give up on."""


def _python_script(argv: tuple[str, ...]) -> str | None:
    """The script of `python SCRIPT.py ...` (how a .py program runs), else None."""
    return argv[1] if len(argv) > 1 and argv[1].endswith(".py") and os.path.basename(argv[0]).startswith("python") else None


def _exec_error(spec: ProcessSpec, err: OSError) -> ProgramError:
    """A shell's verdict on a failed exec: missing program 127; a program that exists but cannot run
    (no permission, not a program, its #! interpreter missing) 126."""
    import shutil

    prog = spec.argv[0]
    where = f"rank {spec.rank} on {spec.host}: cannot run {prog}"
    path = prog if "/" in prog else shutil.which(prog)
    if isinstance(err, FileNotFoundError) and path and os.path.exists(os.path.join(spec.cwd, path)):
        with open(os.path.join(spec.cwd, path), "rb") as f:
            first = f.readline(256).rstrip()
        if first.startswith(b"#!"):
            return ProgramError(f"{where}: bad interpreter {first[2:].decode(errors='replace').strip()} in its #! line", exit_code=126)
    code = 127 if isinstance(err, FileNotFoundError) else 126
    return ProgramError(f"{where}: {err.strerror}", exit_code=code)


def _close_quietly(sel: selectors.BaseSelector, f) -> None:
    if f is None:
        return
    try:
        sel.unregister(f)
    except (KeyError, ValueError):
        pass
    if isinstance(f, int):
        os.close(f)
    else:
        f.close()


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
