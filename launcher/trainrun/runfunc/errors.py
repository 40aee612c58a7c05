"""What trainrun.run raises when the ranks do not all return: RankError (a rank's function raised),
RunError (the job ended otherwise) and ResultTooLarge (a RunError: a value too big to come back). Kept apart from api.py so `trainrun.RankError` costs no launcher import."""
from __future__ import annotations

from trainrun.errors import TrainrunError
from trainrun.wire.runfunc_lines import RankFailure


class RankError(TrainrunError):
    """A rank's function raised. `rank`, `host`, `traceback` (the rank's own text), `exception` (the
    exception object, when it could be pickled back; else None); `failures`: every rank's that raised."""

    def __init__(self, failure: RankFailure, failures: list[RankFailure]):
        self.rank, self.host, self.traceback = failure.rank, failure.host, failure.traceback
        self.exception, self.failures = failure.exception, failures
        others = [f.rank for f in failures if f.rank != failure.rank]
        more = f" (rank(s) {', '.join(map(str, others))} raised too)" if others else ""
        super().__init__(f"rank {failure.rank} on {failure.host} raised {failure.type_name}: {failure.message}{more}\n"
                         f"--- rank {failure.rank}'s traceback ---\n{failure.traceback.rstrip()}")


class RunError(TrainrunError):
    """The job ended without every rank's return value (a rank killed or exited, a host lost, a start-up
    failure): the launcher's exit code and its last lines."""


class ResultTooLarge(RunError):
    """A rank on another host returned a value bigger than the outcome lines carry (wire.max_lines_bytes):
    `rank`, `host`, `size` and `limit` (bytes, pickled)."""

    def __init__(self, rank: int, host: str, size: int, limit: int, setting: str):
        self.rank, self.host, self.size, self.limit = rank, host, size, limit
        super().__init__(f"rank {rank} on {host} returned {size / 2**20:.1f} MiB (pickled), more than the "
                         f"{limit / 2**20:g} MiB a rank on another host can send back ({setting}): write big results "
                         "to a file every host sees and return its path")
