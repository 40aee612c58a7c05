"""Every process of a job on this host, found two ways, and killed: by the job's mark in its environment,
and by the process tree below the process that owns the ranks (a child subreaper).

**The mark.** Killing the ranks' process groups misses descendants that left them (`setsid`,
`start_new_session=True`: daemonizing helpers, some data-loader and compile workers). Every rank is started
with TRAINRUN_JOB_ID and TRAINRUN_HOSTNAME in its environment and a process's initial environment is
inherited by everything it starts, so `/proc/PID/environ` names the job's processes wherever they went. The
host name is part of the mark because several simulated hosts may share one PID namespace (the test bed):
an owner kills its own host's share of the job only.

**The tree.** A descendant started with a cleared environment (`env -i`, `execve(..., envp={})`) carries no
mark. The owner of the ranks (the launcher for its host, the agent elsewhere) makes itself a child
subreaper (`become_subreaper`): an orphan below it is re-parented to it, not to init, so every process the
ranks ever started is either below a live rank or a child of the owner. Those adopted children are told
from the owner's own helpers by their session: ranks start new sessions and nothing below them can rejoin
the owner's (`adopted`). `kill_tree` stops a whole tree first (a stopped process cannot fork), then kills
it, so nothing slips out between the walk and the kill even when the killer is not its ancestor (the
watchdog, the launcher's fresh-connection sweep).

`python -m trainrun.supervisor.reaper JOB_ID HOST [AGENT_PID:START]`: what the launcher runs over a fresh
connection on a host whose agent went silent: kill the agent's whole tree (the agent included, if it is
still the process that started at START) and every process with the job's mark, then remove what the
agent would have removed after them and cannot any more (it is killed with its tree, its watchdog too): the
job's MPICH segments in /dev/shm (mpiworld/shm.py) and its stack-file directory for HOST (diag/stack_dir.py),
both named after the job id; exit 0 when no process is left, 1 otherwise (the survivors on stdout).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterable
from typing import NamedTuple

SWEEP_WAIT_S = 2.0
PR_SET_CHILD_SUBREAPER = 36


def _marks(job_id: str, hosts: Iterable[str]) -> tuple[bytes, set[bytes]]:
    return f"TRAINRUN_JOB_ID={job_id}".encode(), {f"TRAINRUN_HOSTNAME={h}".encode() for h in hosts}


def job_processes(job_id: str, hosts: Iterable[str]) -> list[int]:
    """Live processes (not zombies: their environment reads empty) of job `job_id` on `hosts`, except this one."""
    job_mark, host_marks = _marks(job_id, hosts)
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        data = _read(f"/proc/{name}/environ")
        if data is None or job_mark not in data:  # gone, not ours to read, or not the job's
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


# --- the process tree -------------------------------------------------------------------------------

class Proc(NamedTuple):  # (not a frozen dataclass: ~0.4 ms less to define on every launch, and a table() makes
    # one per process on the host, several times at each teardown)
    """One line of /proc/PID/stat: `start` is the start time in clock ticks since boot (a pid with another
    start time is another process)."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    start: int


def _read(path: str) -> bytes | None:
    """The whole file, None if it cannot be read. os.open/os.read: half the time of open() for /proc's small
    files, read for every process on the host several times at each teardown."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def stat(pid: int) -> Proc | None:
    data = _read(f"/proc/{pid}/stat")
    if data is None:
        return None
    try:
        rest = data[data.rindex(b")") + 2:].split()
        return Proc(pid, int(rest[1]), int(rest[2]), int(rest[3]), rest[0].decode(), int(rest[19]))
    except (ValueError, IndexError):
        return None


def table() -> dict[int, Proc]:
    """Every process this one can see, by pid."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (p := stat(int(name))) is not None:
            out[p.pid] = p
    return out


def descendants(roots: Iterable[int], procs: dict[int, Proc]) -> set[int]:
    """`roots` (those that exist) and everything below them in `procs`."""
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    out, todo = set(), [r for r in roots if r in procs]
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, ())
    return out


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux >= 3.4): orphans below it come to it, not to init.

    prctl(2) through _ctypes, ctypes' C core, when it has the calls for it: the ctypes package defines ~100
    classes on import, ~2 ms of every launch; ctypes itself where _ctypes lacks them."""
    try:
        import _ctypes

        call = _ctypes.call_function  # (what ctypes' own foreign calls come down to; ints are passed as C ints)
        libc = _ctypes.dlopen(None, os.RTLD_NOW)  # type: ignore[arg-type]  # (None: this process's own symbols)
        return call(_ctypes.dlsym(libc, "prctl"), (PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (ImportError, AttributeError):
        pass
    except OSError:
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def ticks_now() -> int:
    """Now, in the unit and clock of Proc.start (clock ticks since boot), rounded down."""
    with open("/proc/uptime") as f:
        return int(float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK")) - 1


def adopted(owner: int, since: int, skip: Iterable[int] = (), procs: dict[int, Proc] | None = None) -> list[Proc]:
    """Children of `owner` (a subreaper) that came from its ranks: another session than the owner's (ranks
    start their own; nothing below them can rejoin the owner's), started at or after `since` (clock ticks),
    not in `skip` (the owner's own helpers in another session: its watchdog)."""
    procs = table() if procs is None else procs
    me = procs.get(owner) or stat(owner)
    if me is None:
        return []
    skip = set(skip)
    return [p for p in procs.values() if p.ppid == owner and p.sid != me.sid and p.start >= since and p.pid not in skip]


def kill_tree(roots: Iterable[int], wait: float = SWEEP_WAIT_S, spare: Iterable[int] = ()) -> list[int]:
    """SIGSTOP `roots` and everything below them until the tree stops growing, then SIGKILL it all; again
    until nothing of it is alive (orphans of a killed process go to its subreaper, which may be one of the
    roots). `spare`: pids never signalled. Returns the live pids left after `wait` s: [] is the promise kept."""
    roots, spare = set(roots), set(spare) | {os.getpid()}
    if not roots:  # no tree to walk (the usual end of a job: every rank reaped, no orphan adopted)
        return []
    deadline = time.monotonic() + wait
    seen: dict[int, int] = {}  # pid -> start: killed ones whose orphans went elsewhere are still followed
    while True:
        stopped: set[int] = set()
        while True:
            procs = table()
            known = {pid for pid, start in seen.items() if pid in procs and procs[pid].start == start}
            tree = {p for p in descendants(roots | known, procs) - spare if procs[p].state not in "ZX"}
            new = tree - stopped
            if not new:
                break
            for pid in new:
                _signal(pid, signal.SIGSTOP)
                seen[pid] = procs[pid].start
            stopped |= new
        if not tree or time.monotonic() > deadline:
            return sorted(tree)
        for pid in tree:
            _signal(pid, signal.SIGKILL)
        time.sleep(0.01)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def reap_adopted(owner_children: Iterable[int]) -> None:
    """Reap zombie children of this process in `owner_children` (adopted orphans that ended: nobody else
    waits for them). Only pids named: waiting for any child would steal the exit status of our own."""
    for pid in owner_children:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


# --- the fresh-connection sweep (python -m trainrun.supervisor.reaper) -------------------------------------

def sweep_host(job_id: str, host: str, agent: str | None) -> list[int]:
    """Kill the tree of the agent `agent` ("PID:START", if that process still is the one that started then)
    and every process with the job's mark on `host`; the pids left."""
    roots = set()
    if agent:
        pid, _, start = agent.partition(":")
        p = stat(int(pid))
        if p is not None and str(p.start) == start:
            roots.add(p.pid)
    left = sorted(set(kill_tree(roots) if roots else []) | set(sweep(job_id, [host])))
    remove_files(job_id, host)  # a survivor (reported) keeps its mappings: unlinking only drops the names
    return left


def remove_files(job_id: str, host: str) -> None:
    """Remove what job `job_id`'s killed ranks on `host` leave there: its MPICH segments in /dev/shm (the
    host's; several simulated hosts each have their own) and its stack-file directory. Never raises."""
    from trainrun.diag.stack_dir import remove_stacks_dir
    from trainrun.mpiworld.shm import kvsname_for, remove_shm_segments

    try:
        remove_shm_segments(kvsname_for(job_id))
    except OSError:
        pass
    remove_stacks_dir(job_id, host)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: python -m trainrun.supervisor.reaper JOB_ID HOST [AGENT_PID:START]", file=sys.stderr)
        return 2
    left = sweep_host(argv[0], argv[1], argv[2] if len(argv) == 3 else None)
    print(" ".join(map(str, left)) if left else "clean", flush=True)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
