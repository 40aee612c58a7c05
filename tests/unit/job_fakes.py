"""Fakes for unit tests of the Job (tests/unit/test_job_state.py, test_exit_policy.py): pure logic, no processes."""
from __future__ import annotations


class FakeSink:
    """A JobOutput that keeps what the Job writes itself (`raw`); `tail`: each rank's last stderr line, if any."""

    broken = False

    def __init__(self, tail: bool = False):
        self.raw: list[bytes] = []
        self._tail = tail

    def feed(self, rank, stream, data): ...
    def stderr_tail(self, rank): return [f"rank {rank}'s last line\n"] if self._tail else []
    def tick(self): ...
    def close(self): ...

    def write_raw(self, stream, data):
        self.raw.append(data)
