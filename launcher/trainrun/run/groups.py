"""The two seams of a running job. Pure declarations.

A **RankGroup** owns some ranks of the job wherever they run: `LocalRanks` (this machine's ranks),
`AgentRanks` (one remote host's ranks, through its agent) and `MpirunRanks` (the whole job under Open
MPI's mpirun). The Job (job.py) drives every group the same way from one selector loop:

    start(sel, watchdog, events)   start the ranks; report through `events` from now on
    tick(now)                      periodic work (heartbeats, late exit reports)
    signal(sig) / kill()           SIGTERM-style stop / SIGKILL of everything the group started
    pmi_send(rank, data)           bytes for a rank's PMI socket
    abandon()                      stop waiting (after SIGKILL went unanswered): report the rest lost
    close(sel) / wait_closed()     release every resource; after both, nothing of the group runs
    running                        how many of its ranks have not been reported ended

Contract: every rank in `specs` is reported exactly once through `on_exit` (a lost host reports its
ranks with 255), and after `kill()` + `close()` + `wait_closed()` no process of the group is left.

**RankEvents** is what a group reports to (the Job on the launcher; the Agent on a remote host).
"""
from __future__ import annotations

import selectors
from typing import Protocol

from trainrun.plan.spec import ProcessSpec
from trainrun.run.watchdog import Watchdog


class RankEvents(Protocol):
    def on_output(self, rank: int, stream: int, data: bytes) -> None:
        """Bytes a rank wrote (stream 1 stdout, 2 stderr); b"" marks the end of that stream."""

    def on_exit(self, rank: int, returncode: int) -> None:
        """A rank ended (negative: killed by that signal; 255: its host was lost)."""

    def on_pmi(self, rank: int, data: bytes) -> None:
        """Bytes a rank wrote on its PMI socket."""

    def on_host_lost(self, host: str, message: str) -> None:
        """A host's agent or connection is gone (its ranks' exits follow as 255)."""

    def on_host_failed(self, host: str, message: str, exit_code: int) -> None:
        """A host could not do its part (e.g. a program did not start there)."""


class RankGroup(Protocol):
    specs: list[ProcessSpec]

    @property
    def running(self) -> int: ...
    def start(self, sel: selectors.BaseSelector, watchdog: Watchdog, events: RankEvents) -> None: ...
    def tick(self, now: float) -> None: ...
    def signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...
    def pmi_send(self, rank: int, data: bytes) -> None: ...
    def abandon(self) -> None: ...
    def close(self, sel: selectors.BaseSelector) -> None: ...
    def wait_closed(self) -> None: ...
