"""An agent's clock offset from the launcher's, estimated from BEAT round trips. Pure.

The launcher sends its time t1; the agent answers at once with its time t2 and t1; the answer arrives at
the launcher's t3. Then offset = t2 - (t1 + t3) / 2 (NTP's estimate), wrong by at most (t3 - t1) / 2.
The sample with the shortest round trip among the last WINDOW is the one used: queueing behind output
only ever lengthens a round trip.
"""
from __future__ import annotations

from collections import deque

WINDOW = 16


class ClockOffset:
    def __init__(self):
        self._samples: deque[tuple[float, float]] = deque(maxlen=WINDOW)  # (round trip, offset)

    def add(self, t1: float, t2: float, t3: float) -> None:
        if t3 >= t1:
            self._samples.append((t3 - t1, t2 - (t1 + t3) / 2))

    @property
    def offset(self) -> float:
        """The agent's clock minus the launcher's (0 before any sample)."""
        return min(self._samples)[1] if self._samples else 0.0

    @property
    def error(self) -> float | None:
        """The bound on the offset's error (half the best round trip), None before any sample."""
        return min(self._samples)[0] / 2 if self._samples else None

    def to_launcher(self, agent_time: float) -> float:
        return agent_time - self.offset
