"""A parameter-server job's (--tf-cluster) ExitPolicy (exit_policy.py): what the Job does when one of its tasks
exits while the job runs. Pure.

    chief / evaluator   they decide the job: exit 0 -> once every one of them has, Done (the ps and workers
                        still serving are stopped, and that teardown is no failure); non-zero -> Fail
    ps                  non-zero -> Fail (the cluster's variables are gone); 0 -> Ignore (wait for the chief)
    worker              non-zero -> Restart it on its host under the same task index, up to `max_restarts`
                        times per task, then Fail; 0 -> Ignore (a worker that ended its own loop)

Once the job was asked to stop (a failure, a signal), an exit is judged as in a static job. "Fail" is the Job's
usual failure (first cause by time, the job's exit code is this task's).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trainrun.plan.roles import Task
from trainrun.supervisor.exit_policy import Done, Fail, Ignore, RankExit, Restart, StaticPolicy, ExitVerdict
from trainrun.supervisor.jobstate import JobState

DECIDERS = ("chief", "evaluator")


@dataclass
class PsPolicy:
    tasks: tuple[Task, ...]  # every rank's task
    max_restarts: int
    restarts: dict[int, int] = field(default_factory=dict)  # rank -> restarts so far
    finished: set[int] = field(default_factory=set)  # deciders that exited 0
    done: bool = False  # every decider exited 0: what ends after that is teardown

    def restart_count(self, rank: int) -> int:
        return self.restarts.get(rank, 0)

    def on_exit(self, ended: RankExit) -> ExitVerdict:
        if self.done:
            return Ignore()  # a ps or worker stopped after the chief finished
        if ended.ours or ended.state.stop_asked:
            return StaticPolicy().on_exit(ended)
        rank, returncode = ended.rank, ended.returncode
        task = self.tasks[rank]
        if task.role in DECIDERS:
            if returncode != 0:
                return Fail()
            self.finished.add(rank)
            deciders = {r for r, t in enumerate(self.tasks) if t.role in DECIDERS}
            self.done = self.finished >= deciders
            return Done() if self.done else Ignore()
        if returncode == 0:
            return Ignore()
        if task.role == "ps":
            return Fail()
        n = self.restarts.get(rank, 0)
        if n >= self.max_restarts:
            return Fail(f"(worker {task.index}: not restarted, --max-restarts {self.max_restarts} used up)")
        self.restarts[rank] = n + 1
        return Restart(f"trainrun: worker {task.index} (rank {rank} on {ended.host}) {ended.how}: restarting it "
                       f"there as worker {task.index} (restart {n + 1} of {self.max_restarts})", n + 1)

    def on_host_down(self, host: str, state: JobState, failed: bool) -> None:
        pass

    def tick(self, now: float) -> None:
        pass
