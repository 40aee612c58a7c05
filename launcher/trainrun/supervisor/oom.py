"""Was a SIGKILLed rank killed by the kernel's OOM killer? What this host lets us see, best first:

1. the kernel log (/dev/kmsg, readable by root): "Memory cgroup out of memory: Killed process PID" /
   "oom-kill:...,pid=PID,..." names the very process. Read from the moment the ranks start.
2. the rank's memory cgroup (v1 memory.oom_control or v2 memory.events, "oom_kill N"): the count rose
   while the rank ran, so the OOM killer struck in its cgroup -- it may have been another process there,
   so this is reported as "probably".

Neither: no verdict (a SIGKILL stays a SIGKILL). dmesg(1) and /proc/pressure are not used.
"""
from __future__ import annotations

import os

KILLED = rb"(?:Killed process |oom-kill:.*?\bpid=)(\d+)"  # compiled when a record is read (re's cache keeps it)
CGROUP_ROOTS = ("/sys/fs/cgroup/memory", "/sys/fs/cgroup")


def _memory_cgroup(pid: int) -> str | None:
    """The directory of `pid`'s memory cgroup (v1 memory controller, else the v2 unified one)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    v1 = [ln.split(":", 2)[2] for ln in lines if ln.split(":", 2)[1:2] and "memory" in ln.split(":", 2)[1].split(",")]
    v2 = [ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")]
    for root, paths in ((CGROUP_ROOTS[0], v1), (CGROUP_ROOTS[1], v2)):
        for path in paths:
            d = os.path.join(root, path.lstrip("/"))
            if os.path.isdir(d):
                return d
    return None


def oom_kills(cgroup: str | None) -> int | None:
    """The cgroup's oom_kill count, or None where it cannot be read."""
    if cgroup is None:
        return None
    for name in ("memory.oom_control", "memory.events"):
        try:
            with open(os.path.join(cgroup, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


class OomWatch:
    """Watches the kernel log and the ranks' memory cgroups from construction on."""

    def __init__(self):
        self._cgroups: dict[int, tuple[str | None, int | None]] = {}
        self._killed: dict[int, str] = {}
        try:
            self._kmsg: int | None = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.lseek(self._kmsg, 0, os.SEEK_END)
        except OSError:
            self._kmsg = None

    def watch(self, pid: int) -> None:
        """Note `pid`'s memory cgroup and its oom_kill count now (call right after it started)."""
        cgroup = _memory_cgroup(pid)
        self._cgroups[pid] = (cgroup, oom_kills(cgroup))

    def _read_kmsg(self) -> None:
        while self._kmsg is not None:
            try:
                record = os.read(self._kmsg, 8192)
            except BlockingIOError:
                return
            except BrokenPipeError:  # records were overwritten before we read them: go on with the next
                continue
            except OSError:
                return
            if not record:
                return
            import re

            if m := re.search(KILLED, record):
                text = record.split(b";", 1)[-1].strip().decode(errors="replace")
                self._killed.setdefault(int(m.group(1)), text)

    def verdict(self, pid: int) -> str | None:
        """Why `pid` (just found killed by SIGKILL) looks like an OOM kill, or None."""
        self._read_kmsg()
        if pid in self._killed:
            return f"out of memory: the kernel's OOM killer killed it ({self._killed[pid][:160]})"
        cgroup, before = self._cgroups.get(pid, (None, None))
        after = oom_kills(cgroup)
        if before is not None and after is not None and after > before:
            return f"probably out of memory: its memory cgroup {cgroup} counted {after - before} OOM kill(s) meanwhile"
        return None

    def close(self) -> None:
        if self._kmsg is not None:
            os.close(self._kmsg)
            self._kmsg = None
