"""The two seams of a running job. Pure declarations.

A **RankGroup** owns some ranks of the job wherever they run: `LocalRanks` (this machine's ranks),
`AgentRanks` (one remote host's ranks, through its agent) and `MpirunRanks` (the whole job under Open
MPI's mpirun). The Job (job.py) drives every group the same way from one selector loop:

    start(sel, watchdog, events)   start the ranks; report through `events` from now on
    tick(now)                      periodic work (heartbeats, late exit reports)
    signal(sig) / kill()           SIGTERM-style stop / SIGKILL of everything the group started
    pmi_send(rank, data)           bytes for a rank's PMI socket
    dump(request, use_py_spy)      take the Python stacks of its running ranks; answer with on_stacks
    abandon()                      stop waiting (after SIGKILL went unanswered): report the rest lost
    restart(rank, count)           start an ended rank again (parameter-server jobs' workers: supervisor/ps_policy.py)
    close(sel) / wait_closed()     release every resource; after both, nothing of the group runs
    running                        how many of its ranks have not been reported ended
    cleanup_note, may_still_run    after wait_closed: what came of cleaning up a lost host over a fresh connection
                                   (None: nothing to say), and how many of its ranks may still run there (0 for
                                   groups that own their ranks' processes: LocalRanks, MpirunRanks)

Contract: every rank in `specs` is reported exactly once through `on_exit` (a lost host reports its
ranks with 255), and after `kill()` + `close()` + `wait_closed()` no process of the group is left.

**RankEvents** is what a group reports to (the Job on the launcher; the Agent on a remote host).
"""
from __future__ import annotations

import selectors
from typing import TYPE_CHECKING, NamedTuple, Protocol

from trainrun.plan.spec import ProcessSpec
from trainrun.supervisor.watchdog import Watchdog

if TYPE_CHECKING:
    from trainrun.diag.stacks import RankStack


class ExitInfo(NamedTuple):
    """When and how a rank ended, as its host saw it. `at`: wall-clock seconds on the *launcher's*
    clock (an agent's time is corrected by AgentRanks, to within `error` seconds); `oom`: why it looks
    like an OOM kill, or None."""

    at: float
    oom: str | None = None
    error: float = 0.0


class RankEvents(Protocol):
    batch_time: float  # time.time() when the owner's loop woke for the events it is dispatching: when
    #                    a rank's exit was seen (callbacks of one wake-up run one after another)

    def on_output(self, rank: int, stream: int, data: bytes) -> None:
        """Bytes a rank wrote (stream 1 stdout, 2 stderr); b"" marks the end of that stream."""

    def on_exit(self, rank: int, returncode: int, info: ExitInfo | None = None) -> None:
        """A rank ended (negative: killed by that signal; 255: its host was lost); `info`: when, and OOM."""

    def on_pmi(self, rank: int, data: bytes) -> None:
        """Bytes a rank wrote on its PMI socket."""

    def on_host_lost(self, host: str, message: str) -> None:
        """A host's agent or connection is gone (its ranks' exits follow as 255)."""

    def on_host_failed(self, host: str, message: str, exit_code: int) -> None:
        """A host could not do its part (e.g. a program did not start there)."""

    def on_progress(self, rank: int, perf: str = "") -> None:
        """The rank's runtime made progress (collectives completed): it is not hung. `perf`: empty, or
        a window summary "WALL WAIT COLL LAST STEPS" (wire/perf_line.py) for straggler detection."""

    def on_stall(self, rank: int, notice: str) -> None:
        """The rank's runtime says the job cannot go on (runtime/rankhook.py's line, passed on whole):
        "stall RANKS SECONDS NAMES" (it raised a StallError: RANKS did not submit NAMES) or "stuck
        SECONDS WHAT" (it waited that long in WHAT while no collective round completed: a peer's engine
        takes no part at all). supervisor/stall.py reads it."""

    def on_stacks(self, request: int, stacks: list[RankStack]) -> None:
        """The answer to dump(request): the stacks of the group's running ranks."""


class RankGroup(Protocol):
    specs: list[ProcessSpec]
    cleanup_note: str | None
    may_still_run: int

    @property
    def running(self) -> int: ...
    def start(self, sel: selectors.BaseSelector, watchdog: Watchdog, events: RankEvents) -> None: ...
    def tick(self, now: float) -> None: ...
    def signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...
    def pmi_send(self, rank: int, data: bytes) -> None: ...
    def dump(self, request: int, use_py_spy: bool) -> None: ...
    def abandon(self) -> None: ...
    def restart(self, rank: int, count: int) -> None: ...
    def close(self, sel: selectors.BaseSelector) -> None: ...
    def wait_closed(self) -> None: ...
