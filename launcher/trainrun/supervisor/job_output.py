"""JobOutput: what the Job (job.py) writes its ranks' output through. A declaration only.

Implemented by output.OutputSink (the console and --output-dir) and by mpirun.RetaggingSink (mpirun's tagged
lines split by rank, then passed to an OutputSink). The Job feeds every rank's bytes, writes its own lines
(stacks, a restart) raw, reads a rank's stderr tail for the failure it names, and watches `broken`.
"""
from __future__ import annotations

from typing import Protocol


class JobOutput(Protocol):
    @property
    def broken(self) -> bool:
        """The reader of the launcher's output went away (`| head`): the Job ends as on SIGPIPE."""
        ...

    def feed(self, rank: int, stream: int, data: bytes) -> None:
        """Bytes rank `rank` wrote on `stream` (1 stdout, 2 stderr); b"" marks that stream's end."""
        ...

    def write_raw(self, stream: int, data: bytes) -> None:
        """The launcher's own text, as is."""
        ...

    def stderr_tail(self, rank: int) -> list[str]:
        """The last lines rank `rank` wrote on stderr (for the failure that names it; [] if not kept)."""
        ...

    def tick(self) -> None:
        """Periodic work from the Job's loop (folded lines whose window passed)."""
        ...

    def close(self) -> None:
        """Write what is pending and release files; nothing is fed after this."""
        ...
