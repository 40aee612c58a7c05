"""Which way a rank waits for a data transfer it has nothing to do beside, chosen by measuring it.

The two ways (waiting.wait_blocked runs them):
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
so each rank measures its own waits and keeps the faster way: measured so, 4 ranks ran at 6.8-7.0 ms and
with the hogs at 10.7-11.3, the faster way's time in each. Between 2 ranks the wait's time misled (beside
the hogs MPI_Wait shortened the wait but took compute's CPU: the step went from 1.13-1.18x of torch DDP's
speed to 1.05-1.06x), and the transfer is one exchange that a sleep delays once: TransferWait asks the
tuner only among more than 2 ranks.

Rule, per transfer size class (the size's bit length: a step's buckets differ in size, and alternating
ways over a repeating mix of sizes would pair each way with one size): EXPLORE waits of each way,
alternated; the way with the lower median then serves the next EXPLOIT waits; then it measures again,
so a change of load (a hog that starts or ends) is followed within EXPLORE * 2 + EXPLOIT transfers.

Pure bookkeeping, no clock and no MPI: the caller asks `choose(key)`, times the wait, and reports it
with `record(key, way, seconds)` when choose said it was measuring. Ranks choose independently: the way a
rank waits is its own affair (the transfer is the same MPI call either way). Not thread-safe: an engine's
transfers run one at a time, under its drive lock.
"""
from __future__ import annotations

from statistics import median

SLEEP, MPI = 0, 1
EXPLORE = 8    # waits of each way per measurement
EXPLOIT = 256  # waits with the faster way before measuring again


class _Size:
    __slots__ = ("times", "best", "left")

    def __init__(self):
        self.times: tuple[list[float], list[float]] = ([], [])
        self.best: int | None = None  # the faster way at the last measurement (None: none yet)
        self.left = 0  # waits left with `best` before measuring again (0: measuring)


class TransferTuner:
    def __init__(self, explore: int = EXPLORE, exploit: int = EXPLOIT):
        self._explore, self._exploit = explore, exploit
        self._sizes: dict[int, _Size] = {}

    def choose(self, key: int) -> tuple[int, bool]:
        """(way, measuring) for the next wait of size class `key`; report a measuring wait with record()."""
        s = self._sizes.get(key)
        if s is None:
            s = self._sizes[key] = _Size()
        if s.left > 0:
            s.left -= 1
            return s.best, False
        sleeps, waits = s.times
        return (SLEEP if len(sleeps) <= len(waits) else MPI), True

    def record(self, key: int, way: int, seconds: float) -> None:
        """A measuring wait of `key` took `seconds` with `way`; once both ways have EXPLORE, the faster
        (lower median; a tie keeps SLEEP, the CPU-friendlier) serves the next EXPLOIT waits."""
        s = self._sizes[key]
        s.times[way].append(seconds)
        sleeps, waits = s.times
        if len(sleeps) >= self._explore and len(waits) >= self._explore:
            s.best = MPI if median(waits) < median(sleeps) else SLEEP
            s.left = self._exploit
            s.times = ([], [])

    def best(self, key: int) -> int | None:
        """The way the last measurement of `key` chose, None before one."""
        s = self._sizes.get(key)
        return None if s is None else s.best
