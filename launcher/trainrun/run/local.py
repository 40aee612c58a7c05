"""LocalRanks: start and own the ranks of one host, on the machine this code runs on.

A RankGroup (groups.py). Used by the launcher for its own host and by the agent (trainrun.agent) on
every remote host, so local and remote ranks behave the same. Each rank runs in its own session (process group = its pid), its
stdout/stderr are pipes, its exit is watched with a pidfd, and, when the MPI world is on, it gets a
PMI-1 socket (PMI_FD). Everything is reported to the `RankEvents` sink given to `start` from the owner's selector loop.

Cleanup contract: `signal()` reaches each live rank's whole process group; `kill()` SIGKILLs every
group the ranks ever had (grandchildren included); the Watchdog does the same if the owner dies.
"""
from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import time
from typing import TYPE_CHECKING

from trainrun.errors import ProgramError
from trainrun.plan.spec import ProcessSpec
from trainrun.run.watchdog import Watchdog

if TYPE_CHECKING:  # the seam, for readers and type checkers; not imported at run time
    from trainrun.run.control import ControlServer
    from trainrun.run.groups import RankEvents

EXIT_LINGER = 0.5  # seconds to wait for a dead rank's pipes (held open by its children) before reporting


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
    return env


class _Rank:
    def __init__(self, spec: ProcessSpec, proc: subprocess.Popen, pidfd: int, pmi: socket.socket | None):
        self.spec, self.proc, self.pidfd, self.pmi = spec, proc, pidfd, pmi
        self.open_streams = 2
        self.returncode: int | None = None
        self.exit_deadline = 0.0
        self.reported = False


class LocalRanks:
    """The ranks `procs` (all of this host), started as children of this process."""

    def __init__(self, procs: list[ProcessSpec], *, pmi: bool = False, base_env: dict | None = None,
                 control: ControlServer | None = None):
        """`control`: an elastic job's control channels (run/control.py): each rank gets TRAINRUN_CTL_FD."""
        self.specs = procs
        self.control = control
        self.events: RankEvents | None = None
        self.pmi = pmi
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.ranks: dict[int, _Rank] = {}
        self._pgids: list[int] = []

    def start(self, sel: selectors.BaseSelector, watchdog: Watchdog, events: RankEvents) -> None:
        """Start every rank. Raises ProgramError (after killing those started) if one cannot exec."""
        self.events = events
        cores = core_sets()
        for spec in self.specs:
            if not os.path.isdir(spec.cwd):
                self.kill()
                raise ProgramError(f"rank {spec.rank} on {spec.host}: working directory {spec.cwd} does not exist there; pass --workdir", exit_code=127)
            try:
                self._start_one(spec, sel, watchdog, cores)
            except OSError as err:
                self.kill()
                raise _exec_error(spec, err) from None

    def _start_one(self, spec: ProcessSpec, sel, watchdog: Watchdog, cores: list[set[int]]) -> None:
        env = host_env(spec, self.base_env, len(os.sched_getaffinity(0)))
        env = {k: v for k, v in env.items() if not k.startswith("PMI_")}  # an outer launcher's PMI is not ours
        pass_fds, child_sock, parent_sock = (), None, None
        if self.pmi:
            from trainrun.mpi.pmi import socket_env

            parent_sock, child_sock = socket.socketpair()
            pass_fds = (child_sock.fileno(),)
            env.update(socket_env(spec.rank, spec.assignment.size, child_sock.fileno()))
        ctl_sock = None
        if self.control is not None:
            ctl_sock = self.control.child_end(spec.rank, sel)
            pass_fds += (ctl_sock.fileno(),)
            env["TRAINRUN_CTL_FD"] = str(ctl_sock.fileno())
        preexec = None
        if spec.bind_to == "core" and cores:
            cpus = cores[spec.assignment.local_rank % len(cores)]
            preexec = lambda: os.sched_setaffinity(0, cpus)  # noqa: E731
        try:
            proc = subprocess.Popen(
                spec.argv, cwd=spec.cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, pass_fds=pass_fds, start_new_session=True, preexec_fn=preexec,
            )
        finally:
            for sock in (child_sock, ctl_sock):
                if sock is not None:
                    sock.close()
        watchdog.add(proc.pid)
        self._pgids.append(proc.pid)
        rank = _Rank(spec, proc, os.pidfd_open(proc.pid), parent_sock)
        self.ranks[spec.rank] = rank
        sel.register(proc.stdout, selectors.EVENT_READ, lambda: self._read(rank, 1, proc.stdout, sel))
        sel.register(proc.stderr, selectors.EVENT_READ, lambda: self._read(rank, 2, proc.stderr, sel))
        sel.register(rank.pidfd, selectors.EVENT_READ, lambda: self._reap(rank, sel))
        if parent_sock is not None:
            sel.register(parent_sock, selectors.EVENT_READ, lambda: self._read_pmi(rank, sel))

    def _read(self, rank: _Rank, stream: int, pipe, sel) -> None:
        data = os.read(pipe.fileno(), 1 << 16)
        self.events.on_output(rank.spec.rank, stream, data)
        if not data:
            sel.unregister(pipe)
            pipe.close()
            rank.open_streams -= 1
            self._maybe_report(rank)

    def _read_pmi(self, rank: _Rank, sel) -> None:
        try:
            data = rank.pmi.recv(1 << 16)
        except OSError:
            data = b""
        if data:
            self.events.on_pmi(rank.spec.rank, data)
        else:
            sel.unregister(rank.pmi)

    def pmi_send(self, rank: int, data: bytes) -> None:
        sock = self.ranks[rank].pmi
        try:
            sock.sendall(data)
        except OSError:
            pass  # the rank is gone; its exit is reported separately

    def _reap(self, rank: _Rank, sel) -> None:
        sel.unregister(rank.pidfd)
        os.close(rank.pidfd)
        rank.returncode = rank.proc.wait()
        rank.exit_deadline = time.monotonic() + EXIT_LINGER
        self._maybe_report(rank)

    def _maybe_report(self, rank: _Rank, now: float | None = None) -> None:
        if rank.reported or rank.returncode is None:
            return
        if rank.open_streams and (now is None or now < rank.exit_deadline):
            return
        rank.reported = True
        self.events.on_exit(rank.spec.rank, rank.returncode)

    def tick(self, now: float) -> None:
        """Report exits whose pipes are still held open by a rank's children after EXIT_LINGER."""
        for rank in self.ranks.values():
            self._maybe_report(rank, now)

    @property
    def running(self) -> int:
        return sum(1 for r in self.ranks.values() if not r.reported)

    def signal(self, sig: int) -> None:
        """Send `sig` to the process group of every rank that has not exited."""
        for rank in self.ranks.values():
            if rank.returncode is None:
                _killpg(rank.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL every process group the ranks had: nothing of the job survives."""
        for pgid in self._pgids:
            _killpg(pgid, signal.SIGKILL)

    def close(self, sel: selectors.BaseSelector) -> None:
        """Release pipes and sockets (after kill); reaps ranks that were never reaped."""
        for rank in self.ranks.values():
            for f in (rank.proc.stdout, rank.proc.stderr, rank.pmi):
                _close_quietly(sel, f)
            if rank.returncode is None:
                _close_quietly(sel, rank.pidfd)
                rank.returncode = rank.proc.wait()
        if self.control is not None:
            self.control.release(sel)

    def wait_closed(self) -> None:
        """Nothing to wait for: close() reaped every rank."""

    def abandon(self) -> None:
        """Local ranks always report after SIGKILL: nothing to give up on."""


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
