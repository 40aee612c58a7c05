"""How a job decides its end: the ExitPolicy seam the Job (job.py) consults, its verdicts, and the static policy.

The Job owns the mechanics (recording a failure, stopping and killing the ranks, its state in jobstate.py); a
policy only judges. When a rank ends, the Job describes the end (RankExit: pure data) and asks its policy for a
ExitVerdict, which it then carries out:

    Ignore()            nothing to do (a success, the launcher's own teardown, an elastic reset exit);
                        `stop_others_in` s: not a failure, but stop the ranks still running after that long
    Fail(note)          the job's usual failure: recorded (the first by time is the cause, settled at the end),
                        then every rank is stopped -- now, or after `stop_others_in` s so that the others may
                        fail on their own first (a failure they share shows as such)
    Restart(line, n)    start the rank again on its host (the line printed first; `n`: its restart count)
    Done()              the job succeeded: stop the ranks still running; their ends are teardown

Policies (one per kind of job, chosen where the Job is assembled: supervisor/assemble.py):

    StaticPolicy     a static job: any rank that fails fails the job (this module)
    AttemptPolicy    one attempt of an elastic job (elasticjob/attempt.py): reset exits after a host-change notice,
                     start-up failures settle, how each rank ended and which host failed
    PsPolicy         a parameter-server job (ps_policy.py): the chief decides, workers restart in place

A policy never changes the Job: it keeps its own records (the elastic loop reads an AttemptPolicy's after the
attempt) and is testable without processes. Besides exits, the Job tells it of lost or failed hosts
(`on_host_down`) and gives it the loop's time (`tick`).
"""
from __future__ import annotations

from typing import NamedTuple, Protocol, Union

from trainrun.supervisor.jobstate import JobState


# The values here are NamedTuples, not frozen dataclasses: every launch defines them, and a NamedTuple costs
# ~0.07 ms to define against ~0.4 ms (scripts/bench_launch.py). A verdict is told apart by its type (isinstance).


class RankExit(NamedTuple):
    """A rank's end as the Job saw it, with what the Job knew at that moment. Pure data."""

    rank: int
    returncode: int          # negative: killed by that signal; 255: its host was lost
    host: str
    how: str = ""            # "exited with code 1", "was killed by SIGKILL (out of memory)"
    at: float = 0.0          # time.monotonic() when the Job was told
    last_line: str = ""      # the rank's last stderr line (stripped), "" if none
    state: JobState = JobState.RUNNING  # the Job's state when the end was reported
    ours: bool = False       # killed by the launcher's own SIGTERM/SIGKILL (its teardown, not a failure)
    world_formed: bool = False  # every rank of the job had initialized its MPI world
    failed: bool = False     # the job had already recorded the failure that stops it


class Ignore(NamedTuple):
    """Not a failure. `stop_others_in`: stop the ranks still running after that many seconds (None: never)."""

    stop_others_in: float | None = None


class Fail(NamedTuple):
    """The job's failure: recorded with `note` added to its description, then every rank stopped after
    `stop_others_in` seconds (0: now)."""

    note: str = ""
    stop_others_in: float = 0.0


class Restart(NamedTuple):
    """Start the rank again on its host, as planned, with restart count `restart_count`; print `line` first."""

    line: str
    restart_count: int


class Done(NamedTuple):
    """The job succeeded: stop the ranks still running; what ends after this is teardown."""


ExitVerdict = Union[Ignore, Fail, Restart, Done]  # (Union: the package runs on Python 3.9)


class ExitPolicy(Protocol):
    """What decides a job's end. Called from the Job's loop thread only."""

    def on_exit(self, ended: RankExit) -> ExitVerdict:
        """Judge a rank's end. Called exactly once per reported end (a restarted rank's ends included)."""
        ...

    def on_host_down(self, host: str, state: JobState, failed: bool) -> None:
        """`host` was lost or could not do its part; the Job fails (exit 255, or the host's code) whatever the
        policy says. `state`, `failed`: as in RankExit."""
        ...

    def tick(self, now: float) -> None:
        """The loop's time (monotonic seconds), every Job.TICK or sooner while ranks run."""
        ...


class StaticPolicy:
    """A static job: a rank that exits non-zero or is killed fails the job, unless the launcher killed it."""

    def on_exit(self, ended: RankExit) -> ExitVerdict:
        if ended.returncode == 0 or ended.ours:
            return Ignore()
        return Fail()

    def on_host_down(self, host: str, state: JobState, failed: bool) -> None:
        pass

    def tick(self, now: float) -> None:
        pass
