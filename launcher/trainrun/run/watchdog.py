"""A guardian that kills the job's process groups if the process that owns them dies.

Ranks run in their own sessions, so nothing kills them when their launcher (or agent) is SIGKILLed.
`Watchdog()` forks a tiny child in its own session that holds the read end of a pipe; the owner writes
each rank's process group to it, and the job's mark (reaper.py). If the owner dies, the pipe reaches
EOF and the child SIGKILLs every group it was told about (grandchildren of the ranks included), then
every process carrying the mark (those that left the groups). `close()` tells it the job ended
cleanly. Fork it before any rank starts, so it inherits nothing but the pipe.
"""
from __future__ import annotations

import os
import signal


class Watchdog:
    def __init__(self):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: never returns
            os.close(w)
            _guard(r)
        os.close(r)
        self._w, self.pid = w, pid

    def add(self, pgid: int) -> None:
        os.write(self._w, b"+%d\n" % pgid)

    def mark(self, job_id: str, hosts: list[str]) -> None:
        """Also kill every process of job `job_id` on `hosts` (reaper.py) if the owner dies."""
        os.write(self._w, ("j" + "\t".join([job_id, *hosts]) + "\n").encode())

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
        os.waitpid(self.pid, 0)


def _guard(r: int) -> None:
    try:
        os.setsid()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, r)
        os.closerange(r + 1, 65536)
        groups, marks, buf = set(), set(), b""
        while True:
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
                else:
                    groups.add(int(line[1:]))
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        from trainrun.run.reaper import sweep

        for job_id, *hosts in marks:
            sweep(job_id, hosts)
    finally:
        os._exit(0)
