"""Every process of a job on this host, found by the job's mark in its environment, and killed.

Killing the ranks' process groups misses descendants that left them (`setsid`, `start_new_session=True`:
daemonizing helpers, some data-loader and compile workers); they are re-parented to init and survive.
Every rank is started with TRAINRUN_JOB_ID and TRAINRUN_HOSTNAME in its environment and a process's
initial environment is inherited by everything it starts, so `/proc/PID/environ` names the job's
processes wherever they went. The host name is part of the mark because several simulated hosts may
share one PID namespace (the test bed): an owner kills its own host's share of the job only.

Limits: a descendant started with a cleared environment (`env -i`, `execve(..., envp={})`) carries no
mark; processes of other users are unreadable unless we are root. cgroup v2 would close both gaps; this
code does not need it (cgroup v1 machines).
"""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable

SWEEP_WAIT_S = 2.0


def _marks(job_id: str, hosts: Iterable[str]) -> tuple[bytes, set[bytes]]:
    return f"TRAINRUN_JOB_ID={job_id}".encode(), {f"TRAINRUN_HOSTNAME={h}".encode() for h in hosts}


def job_processes(job_id: str, hosts: Iterable[str]) -> list[int]:
    """Live processes (not zombies: their environment reads empty) of job `job_id` on `hosts`, except this one."""
    job_mark, host_marks = _marks(job_id, hosts)
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                data = f.read()
        except OSError:  # gone, or not ours to read
            continue
        if job_mark not in data:
            continue
        env = data.split(b"\0")
        if job_mark in env and any(m in env for m in host_marks):
            out.append(int(name))
    return out


def sweep(job_id: str, hosts: Iterable[str], wait: float = SWEEP_WAIT_S) -> list[int]:
    """SIGKILL every process of the job on `hosts` until none is left (new ones may be forked meanwhile).
    Returns the pids still alive after `wait` seconds: [] is the promise kept."""
    hosts = tuple(hosts)
    deadline = time.monotonic() + wait
    while True:
        pids = job_processes(job_id, hosts)
        if not pids or time.monotonic() > deadline:
            return pids
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)
