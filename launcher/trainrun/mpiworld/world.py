"""The job's MPI world, seen from its process manager: one PmiServer for all hosts, the start
timeout, and the shared-memory cleanup MPICH leaves to us.

The process group feeds it every PMI byte any rank sends (local sockets or relayed by agents) and
routes the replies back; it turns what it learns into `WorldProblem`s that fail the job:
MPI_Abort (exit with the abort code), protocol errors, and ranks that never join within
`start_timeout` seconds of the first one (exit 124).
"""
from __future__ import annotations

from dataclasses import dataclass

from trainrun import log
from trainrun.mpiworld.pmi import PmiJob, PmiServer, process_mapping
from trainrun.mpiworld.shm import kvsname_for, remove_shm_segments
from trainrun.plan.spec import LaunchPlan


@dataclass(frozen=True)
class WorldProblem:
    rank: int | None
    exit_code: int
    message: str


class MpiWorld:
    def __init__(self, plan: LaunchPlan, start_timeout: float):
        counts = [len(procs) for procs in plan.by_host().values()]
        self.job = PmiJob(len(plan.procs), kvsname_for(plan.job.job_id), process_mapping(counts))
        self.server = PmiServer(self.job)
        self.start_timeout = start_timeout
        self.initialized: set[int] = set()
        self._first_init: float | None = None

    def feed(self, rank: int, data: bytes, now: float) -> tuple[list[tuple[int, bytes]], WorldProblem | None]:
        """Handle bytes from `rank`; returns (replies to send, a problem that must end the job or None)."""
        step = self.server.feed(rank, data)
        if step.initialized and self._first_init is None:
            self._first_init = now
        self.initialized.update(step.initialized)
        for r, msg in step.unsupported:
            log.warning("rank %d: %s", r, msg)
        if step.aborted:
            r, code, _msg = step.aborted
            return step.replies, WorldProblem(r, code, f"called MPI_Abort with code {code}")
        if step.errors:
            r, msg = step.errors[0]
            return step.replies, WorldProblem(r, 1, f"broke the PMI protocol: {msg}")
        return step.replies, None

    def check_start(self, now: float) -> WorldProblem | None:
        """After the first rank joined, every rank must join within start_timeout seconds."""
        if self._first_init is None or len(self.initialized) == self.job.size:
            return None
        if now - self._first_init < self.start_timeout:
            return None
        missing = sorted(set(range(self.job.size)) - self.initialized)
        shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
        return WorldProblem(None, 124, f"rank(s) {shown} did not join the MPI world within --start-timeout {self.start_timeout:g}s "
                                       "(exited before MPI_Init, or hang in it)")

    def cleanup(self) -> list[str]:
        """Remove the job's /dev/shm segments (left behind by killed or aborted ranks)."""
        return remove_shm_segments(self.job.kvsname)
