"""Which way a rank waits for a data transfer it has nothing to do beside, chosen by measuring it.

The two ways (waiting.TransferWait runs them; docs/benchmarks/transfer_wait.md measures them):
  SLEEP -- the waiting policy's wait_request: MPI_Test between sleeps while the host is oversubscribed,
           which gives the core to whatever else is runnable;
  MPI   -- a few MPI_Tests, then MPICH's MPI_Wait: its progress loop keeps polling, the GIL released.

Neither is right everywhere, and the run queue cannot tell a rank which of the runnable tasks are its own
job's ranks (waiting in the same transfer: polling makes every relay of the allreduce move at once) and
which are other work (a hog, a data-loader worker: polling takes their CPU and the peer's). Measured on 2
cores, the Ray benchmark's model (1 MB of gradients), ms a step, SLEEP / MPI: 4 ranks 8.8-9.4 / 6.0-7.0,
6 ranks 15.6-16.4 / 12.7-13.5, 6 ranks on 3 simulated hosts 21.5-25 / 17-18.8; but 4 ranks beside a CPU
hog per core 9.2-10.9 / 13.1-14.6, and 2 ranks beside them (bench_ceiling.py's hogs) 17.4-18.2 / 22.7-24.8.
The time of the wait itself moved the same way (4 ranks: 3.0-3.2 / 2.2 ms; with the hogs 4.1-4.3 / 5.7-5.9),
so the rank measures, but not the wait alone: MPI_Wait's shorter wait costs the peers' and the hogs' CPU,
which shows in the next compute (4 ranks beside the hogs, each rank keeping the way of its shorter wait:
13.2 ms a step, where the sleeps alone gave 11.5). What is measured is the transfer's period: from the end
of the previous transfer of that size to the end of this one (one bucket a step: the step), in blocks of
one way, so that every rank of a job in step uses the same way at the same time and a way's cost to the
compute after it falls in its own block.

Rule, per transfer size class (the size's bit length: a step's buckets differ in size): EXPLORE periods
with SLEEP, then EXPLORE with MPI (the first of each block not counted: its compute followed the other
way); the way with the lower median then serves the next EXPLOIT transfers; then it measures again, so a
change of load (a hog that starts or ends) is followed within 2 * EXPLORE + EXPLOIT transfers.

Pure bookkeeping, no clock and no MPI: the caller asks `choose(key)`, and when choose said it was measuring
reports the period with `record(key, way, seconds)`. (A transfer that the background thread completes with
nobody blocked is neither chosen nor counted; the next period spans it, with either way alike.) Ranks decide on their own (the transfer is the same
MPI call either way); ranks doing the same transfers walk the same blocks. Not thread-safe: an engine's
transfers run one at a time, under its drive lock.
"""
from __future__ import annotations

from statistics import median

SLEEP, MPI = 0, 1
EXPLORE = 8    # transfers of each way per measurement (the first of each block not counted)
EXPLOIT = 256  # transfers with the faster way before measuring again


class _Size:
    __slots__ = ("times", "best", "left", "seen")

    def __init__(self):
        self.times: tuple[list[float], list[float]] = ([], [])
        self.seen = 0  # transfers of the measurement under way
        self.best: int | None = None  # the faster way at the last measurement (None: none yet)
        self.left = 0  # waits left with `best` before measuring again (0: measuring)


class TransferTuner:
    def __init__(self, explore: int = EXPLORE, exploit: int = EXPLOIT):
        self._explore, self._exploit = explore, exploit
        self._sizes: dict[int, _Size] = {}

    def choose(self, key: int) -> tuple[int, bool]:
        """(way, measuring) for the next transfer of size class `key`; report a measuring one with record()."""
        s = self._sizes.get(key)
        if s is None:
            s = self._sizes[key] = _Size()
        if s.left > 0:  # (then a measurement has set best)
            s.left -= 1
            return (SLEEP if s.best is None else s.best), False
        return (SLEEP if s.seen < self._explore else MPI), True

    def record(self, key: int, way: int, seconds: float | None) -> None:
        """A measuring transfer of `key` with `way` ended `seconds` after the previous one of `key` (None: no
        previous, not counted); after both blocks the faster way (lower median; a tie keeps SLEEP, the
        CPU-friendlier) serves the next EXPLOIT transfers."""
        s = self._sizes[key]
        if s.seen % self._explore and seconds is not None:  # (a block's first: its compute followed the other way)
            s.times[way].append(seconds)
        s.seen += 1
        if s.seen == 2 * self._explore:
            sleeps, waits = s.times
            s.best = MPI if sleeps and waits and median(waits) < median(sleeps) else SLEEP
            s.left = self._exploit
            s.times, s.seen = ([], []), 0

    def best(self, key: int) -> int | None:
        """The way the last measurement of `key` chose, None before one."""
        s = self._sizes.get(key)
        return None if s is None else s.best
