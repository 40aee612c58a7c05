"""What a parameter-server job (--tf-cluster) does when one of its tasks exits. Pure: the Job (job.py) asks,
then acts.

    chief / evaluator   they decide the job: exit 0 -> once every one of them has, the job is done (the ps and
                        workers still serving are stopped, and that teardown is no failure); non-zero -> fail
    ps                  non-zero -> fail (the cluster's variables are gone); 0 -> nothing (wait for the chief)
    worker              non-zero -> restart it on its host under the same task index, up to `max_restarts`
                        times per task, then fail; 0 -> nothing (a worker that ended its own loop)

"fail" is the Job's usual failure (first cause by time, the job's exit code is this task's).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trainrun.plan.roles import Task

DECIDERS = ("chief", "evaluator")


@dataclass(frozen=True)
class Verdict:
    """`action`: "wait" (nothing to do), "done" (stop the rest; the job succeeded), "restart" (start the rank
    again) or "fail". `line`: what to print (restart), or what to add to the failure's description."""

    action: str
    line: str = ""


@dataclass
class PsPolicy:
    tasks: tuple[Task, ...]  # every rank's task
    max_restarts: int
    restarts: dict[int, int] = field(default_factory=dict)  # rank -> restarts so far
    finished: set[int] = field(default_factory=set)  # deciders that exited 0

    def restart_count(self, rank: int) -> int:
        return self.restarts.get(rank, 0)

    def on_exit(self, rank: int, returncode: int, how: str, where: str) -> Verdict:
        """Rank `rank` ended with `returncode` (`how`: "exited with code 1" / "was killed by SIGKILL"; `where`:
        its host) while the job was running."""
        task = self.tasks[rank]
        if task.role in DECIDERS:
            if returncode != 0:
                return Verdict("fail")
            self.finished.add(rank)
            deciders = {r for r, t in enumerate(self.tasks) if t.role in DECIDERS}
            return Verdict("done") if self.finished >= deciders else Verdict("wait")
        if returncode == 0:
            return Verdict("wait")
        if task.role == "ps":
            return Verdict("fail")
        n = self.restarts.get(rank, 0)
        if n >= self.max_restarts:
            return Verdict("fail", f"(worker {task.index}: not restarted, --max-restarts {self.max_restarts} used up)")
        self.restarts[rank] = n + 1
        return Verdict("restart", f"trainrun: worker {task.index} (rank {rank} on {where}) {how}: restarting it there "
                                  f"as worker {task.index} (restart {n + 1} of {self.max_restarts})")
