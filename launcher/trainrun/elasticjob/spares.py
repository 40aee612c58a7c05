"""Warm ranks: spare interpreters that an elastic job's restart turns into ranks (issue 31).

A restart of an elastic job starts every rank again (MPICH's world cannot lose a member), and on a quiet
machine ~85% of that restart is each new process importing the framework (`import torch`, and
`torch._dynamo`, which the first optimizer imports). A SparePool keeps, per rank of this host, one process
that has done that already (elastic/spare.py) and hands it the rank's argv, environment and descriptors
when the next attempt starts it (wire/spare_handoff.py). The spare is this process's child, like a cold
rank: LocalRanks owns, watches and reaps it the same way once it is a rank.

Which spare may become which rank: its interpreter and its *start-up environment* must equal the rank's,
since the interpreter and native libraries read some variables at start or import (PYTHONPATH,
OMP_NUM_THREADS, LD_PRELOAD...). Variables trainrun sets per rank or per attempt are read by the runtime
only after the hand-off, so they are left out of a spare's environment and of the comparison
(`late_bound`). Only `python SCRIPT.py ...` and `python -m MODULE ...` are warmed (`warmable`).

When: LocalRanks fills the pool once its attempt's ranks train (their first progress line), so the spares'
imports do not compete with the ranks' own start-up; spares that no rank of the attempt could use are
ended. Cleanup: spares are in their own sessions and registered with the owner's job-long Watchdog through
add_group (killed if the owner dies; add() would make that guardian follow the owner's adopted children, and
with them an attempt's own guardian, killed before it removed the attempt's MPI segments), left out of the owner's sweeps of the job's orphans (`pids`), ended by `close` and when their
socket reaches EOF. A spare that died (its import failed) is dropped and the rank starts cold.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
from dataclasses import dataclass

from trainrun import log
from trainrun.wire.spare_handoff import PAD_VARIABLE, READY, Handoff, send_handoff

SPARE_MODULE = "trainrun.elastic.spare"
# trainrun's contract and settings, the process manager's, and what communication libraries read when the
# program sets them up (the NIC choice changes when the job's hosts do: NCCL_SOCKET_IFNAME...)
_LATE_PREFIXES = ("TRAINRUN_", "HOROVOD_", "PMI_", "SLURM_", "OMPI_", "MPIR_CVAR_", "NCCL_", "GLOO_", "UCX_", "FI_")
_LATE_NAMES = frozenset({"RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "WORLD_SIZE", "NNODES",
                         "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG", "GROUP_RANK", "ROLE_RANK"})


def late_bound(name: str) -> bool:
    """Whether a rank reads variable `name` only after its program started (trainrun's contract and
    runtime settings, PMI): a spare starts without it and gets it at the hand-off. Pure."""
    return name.startswith(_LATE_PREFIXES) or name in _LATE_NAMES


def startup_env(env: dict[str, str]) -> dict[str, str]:
    """The part of a rank's environment its interpreter may read before the program runs. Pure."""
    return {k: v for k, v in env.items() if not late_bound(k)}


def warmable(argv: tuple[str, ...]) -> bool:
    """Whether a spare can become a rank running `argv`: `python SCRIPT.py ...` or `python -m MODULE ...`. Pure."""
    if len(argv) < 2 or not os.path.basename(argv[0]).startswith("python"):
        return False
    return argv[1].endswith(".py") or (argv[1] == "-m" and len(argv) > 2)


def _key(argv: tuple[str, ...], env: dict[str, str]) -> tuple:
    return argv[0], frozenset(startup_env(env).items())


def _differing(a: tuple, b: tuple) -> list[str]:
    """The variables whose values differ between two keys (for the log). Pure."""
    da, db = dict(a[1]), dict(b[1])
    return sorted(k for k in da.keys() | db.keys() if da.get(k) != db.get(k))


@dataclass
class Spare:
    proc: subprocess.Popen
    sock: socket.socket
    key: tuple
    ready: bool = False

    def poll_ready(self) -> bool:
        """Whether it has said READY (reads its socket without waiting); False once it is gone."""
        if not self.ready:
            try:
                data = self.sock.recv(1, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return False
            except OSError:
                data = b""
            if data != READY:
                self.proc.poll()
                return False
            self.ready = True
        return self.proc.poll() is None

    def hand(self, handoff: Handoff, fds: tuple[int, ...]) -> subprocess.Popen:
        """Make it the rank `handoff` describes; OSError if it is gone. The caller owns the process now."""
        if self.proc.poll() is not None:
            raise ProcessLookupError(f"spare {self.proc.pid} exited")
        try:
            send_handoff(self.sock, handoff, fds)
        finally:
            self.sock.close()
        return self.proc

    def end(self) -> None:
        self.sock.close()
        if self.proc.returncode is None:  # once reaped, its pid (and group id) may be another process's
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        self.proc.wait()


class SparePool:
    """The spares of one host's ranks, kept between an elastic job's attempts by the agent (or the launcher).
    `watchdog`: the owner's Watchdog for the whole job (not an attempt's), which kills the spares if the
    owner dies; they also leave by themselves at EOF on their socket."""

    def __init__(self, watchdog) -> None:
        self.watchdog = watchdog
        self._spares: list[Spare] = []

    def fill(self, ranks: list[tuple[tuple[str, ...], str, dict[str, str]]]) -> int:
        """One spare for each of `ranks` ((argv, cwd, full env) of the attempt now running here), keeping
        the live ones that match and ending the others. Returns how many were started."""
        wanted: dict[tuple, list] = {}
        for argv, cwd, env in ranks:
            if warmable(argv):
                wanted.setdefault(_key(argv, env), []).append((argv, cwd, env))
        keep: list[Spare] = []
        for spare in self._spares:
            if spare.proc.poll() is None and wanted.get(spare.key):
                wanted[spare.key].pop()
                keep.append(spare)
            else:
                spare.end()
        self._spares = keep
        started = 0
        for key, left in wanted.items():
            for argv, cwd, env in left:
                new = self._spawn(key, argv, cwd, env)
                if new is not None:
                    self.watchdog.add_group(new.proc.pid)
                    self._spares.append(new)
                    started += 1
        if started:
            log.info("starting %d warm rank(s)", started)
        return started

    def _spawn(self, key: tuple, argv: tuple[str, ...], cwd: str, env: dict[str, str]) -> Spare | None:
        ours, theirs = socket.socketpair()
        late = sum(len(k) + len(v) + 2 for k, v in env.items() if late_bound(k))
        # last: room for the rank's own variables in what /proc/PID/environ shows (elastic/spare.py)
        spawn_env = {**startup_env(env), PAD_VARIABLE: " " * (2 * late + 4096)}
        try:
            proc = subprocess.Popen(
                [argv[0], "-m", SPARE_MODULE, str(theirs.fileno()), *argv[1:]], cwd=cwd, env=spawn_env,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(),), start_new_session=True)
        except OSError as err:
            ours.close()
            log.info("no warm rank: %s", err)
            return None
        finally:
            theirs.close()
        return Spare(proc, ours, key)

    def take(self, argv: tuple[str, ...], env: dict[str, str]) -> Spare | None:
        """A live spare that can become a rank running `argv` with `env` (a ready one first), out of the
        pool; None: start the rank cold."""
        if not warmable(argv):
            return None
        key = _key(argv, env)
        matches = [s for s in self._spares if s.key == key]
        if not matches and self._spares:
            log.info("no warm rank for %s: start-up environment differs in %s", " ".join(argv[:2]),
                     ", ".join(_differing(self._spares[0].key, key)) or "the interpreter")
        for spare in sorted(matches, key=lambda s: not s.poll_ready()):
            self._spares.remove(spare)
            if spare.proc.poll() is None:
                return spare
            spare.end()
        return None

    def pids(self) -> set[int]:
        """The spares' pids: not orphans of a job, whatever their age."""
        return {s.proc.pid for s in self._spares}

    def close(self) -> None:
        """End every spare."""
        for spare in self._spares:
            spare.end()
        self._spares = []
