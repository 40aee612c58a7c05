"""A guardian that kills the job's processes on this host if the process that owns them dies (or, for an
agent, stays stopped).

Ranks run in their own sessions, so nothing kills them when their launcher (or agent) is SIGKILLed.
`Watchdog()` forks a tiny child in its own session that holds the read end of a pipe; the owner writes
each rank's process group to it, and the job's mark (reaper.py). The owner is a child subreaper
(reaper.become_subreaper), so processes of the job that left their ranks' trees (double forks, `env -i
setsid` daemons: no mark, no group) are its children; once the owner dies they are re-parented elsewhere
and look like anyone's. So the guardian looks at the owner's adopted children every POLL_S seconds and
remembers them (pid and start time). If the owner dies, the pipe reaches EOF and the guardian stops and
SIGKILLs every group it was told about, the trees below them and below the adopted children it saw (the
ranks' whole trees), then every process carrying the mark, then unlinks the marked job's MPICH segments
(mpiworld/shm.py), removes its stack-file directories (diag/stack_dir.py) and the files it was told of (`unlink_on_death`: committed-state segments). `close()` tells it the job ended cleanly.
`add_group(pgid)`: a group it kills without following the owner's adopted children (an elastic launcher's
spares, registered with its job-long guardian; following them would take in the attempts' own guardians).

`stop_limit(s)` (agents): also do all that, and SIGKILL the owner, when the owner has been stopped
(SIGSTOP, state T) for `s` seconds: a stopped agent cannot act on a launcher's silence, and the
launcher may be gone. Fork it before any rank starts, so it inherits nothing but the pipe.
"""
from __future__ import annotations

import os
import select
import signal
import time

from trainrun.supervisor import reaper  # (here, not in the guardian: forked with it, it has nothing to import)

POLL_S = 0.5

_LIVE: set[int] = set()  # pids of this process's guardians not yet closed


def guardian_pids() -> frozenset[int]:
    """This process's live guardians: children in another session that are no part of any job, which an
    owner's sweep of adopted orphans must spare (an elastic launcher has one guardian for its whole run
    beside each attempt's; one forked in the same clock tick as a job started looks like its orphan)."""
    return frozenset(_LIVE)


class Watchdog:
    def __init__(self):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: never returns
            os.close(w)
            _guard(r)
        os.close(r)
        self._w, self.pid = w, pid
        _LIVE.add(pid)

    def add(self, pgid: int) -> None:
        os.write(self._w, b"+%d\n" % pgid)

    def add_group(self, pgid: int) -> None:
        """Also SIGKILL process group `pgid` if the owner dies, and nothing more: unlike add(), which also makes
        the guardian follow the owner's adopted children (a job's escaped processes), which would take in
        other guardians of the owner started later (an elastic launcher's guardian for its spares,
        elasticjob/spares.py, must not kill an attempt's guardian before that one has cleaned up)."""
        os.write(self._w, b"g%d\n" % pgid)

    def mark(self, job_id: str, hosts: list[str]) -> None:
        """Also kill every process of job `job_id` on `hosts` (reaper.py) if the owner dies."""
        os.write(self._w, ("j" + "\t".join([job_id, *hosts]) + "\n").encode())

    def unlink_on_death(self, prefix: str) -> None:
        """Also unlink every file whose path starts with `prefix` (a committed-state owner's /dev/shm
        segments: elasticjob/control.py) if the owner dies."""
        os.write(self._w, ("u" + prefix + "\n").encode())

    def stop_limit(self, seconds: float) -> None:
        """Also act (and kill the owner) once the owner has been stopped for `seconds`."""
        os.write(self._w, b"s%f\n" % seconds)

    def close(self) -> None:
        """The owner cleaned up itself: the guardian exits without killing anything."""
        if self._w is None:
            return
        try:
            os.write(self._w, b"x\n")
        except OSError:
            pass
        os.close(self._w)
        self._w = None
        _LIVE.discard(self.pid)
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:  # reaped already (a subreaper's orphan sweep must not, but never fail here)
            pass


def _guard(r: int) -> None:
    try:
        owner = os.getppid()
        os.setsid()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, r)
        os.closerange(r + 1, 65536)
        me = reaper.stat(os.getpid())
        since = me.start if me else 0  # forked before any rank: the job's processes are younger
        groups: set[int] = set()
        marks: set[tuple[str, ...]] = set()
        unlinks: set[str] = set()
        buf = b""
        only: set[int] = set()  # add_group()'s: killed, without following the owner's adopted children
        adopted: dict[int, int] = {}  # pid -> start of the owner's adopted children seen so far
        limit, stopped_since, kill_owner = None, None, False
        next_look = 0.0  # the owner's children are looked at every POLL_S s, not at every message (a job's start
        while True:      # sends one per rank: a /proc scan each, on the cores its ranks are starting on)
            wait = max(0.0, next_look - time.monotonic()) if groups else POLL_S
            if select.select([r], [], [], wait)[0]:
                data = os.read(r, 4096)
                if not data:
                    break
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line == b"x":
                        os._exit(0)
                    if line.startswith(b"j"):
                        marks.add(tuple(line[1:].decode().split("\t")))
                    elif line.startswith(b"s"):
                        limit = float(line[1:])
                    elif line.startswith(b"u"):
                        unlinks.add(line[1:].decode())
                    elif line.startswith(b"g"):
                        only.add(int(line[1:]))
                    else:
                        groups.add(int(line[1:]))
            if not groups or time.monotonic() < next_look:
                continue
            next_look = time.monotonic() + POLL_S
            procs = reaper.table()
            for p in reaper.adopted(owner, since, (os.getpid(),), procs):
                adopted[p.pid] = p.start
            state = procs[owner].state if owner in procs else None
            if state is None or os.getppid() != owner:  # gone (EOF follows at once) or re-parented
                continue
            if limit is not None and state in "Tt":
                stopped_since = stopped_since or time.monotonic()
                if time.monotonic() - stopped_since >= limit:
                    kill_owner = True
                    break
            else:
                stopped_since = None
        procs = reaper.table()
        roots = {pid for pid, start in adopted.items() if pid in procs and procs[pid].start == start}
        roots |= {p.pid for p in procs.values() if p.pgid in groups or p.pgid in only}
        if kill_owner:  # freeze the owner too: it must not start anything while its tree goes
            roots.add(owner)
        reaper.kill_tree(roots)
        for pgid in groups | only:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        for job_id, *hosts in marks:
            reaper.sweep(job_id, hosts)
        if marks:  # the job's MPICH segments and stack files: its killed ranks leave them (mpiworld/shm.py, diag/stack_dir.py)
            from trainrun.diag.stack_dir import remove_stacks_dir
            from trainrun.mpiworld.shm import kvsname_for, remove_shm_segments

            for job_id, *hosts in marks:
                try:
                    remove_shm_segments(kvsname_for(job_id))
                except OSError:
                    pass
                for host in hosts:
                    remove_stacks_dir(job_id, host)
        for prefix in unlinks:  # after the kills: no rank writes them any more
            d, base = os.path.split(prefix)
            for name in os.listdir(d or "."):
                if name.startswith(base):
                    try:
                        os.unlink(os.path.join(d, name))
                    except OSError:
                        pass
    finally:
        os._exit(0)
