"""What a finished job amounts to: JobResult (exit code, per-rank return codes, the first failure) and
the summary line the launcher prints. Pure."""
from __future__ import annotations

import signal
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Failure:
    """Why the job failed: the first failing rank (or the MPI world, or a host), with the exit code it implies."""

    exit_code: int
    what: str
    rank: int | None = None
    stderr_tail: tuple[str, ...] = ()


@dataclass
class JobResult:
    """Filled in by the Job as events arrive; final once Job.run() returns."""

    exit_code: int = 0
    returncodes: dict[int, int] = field(default_factory=dict)
    failure: Failure | None = None
    interrupted_by: int | None = None

    def summary(self, size: int) -> str | None:
        """The failure summary the launcher prints, or None for a clean run."""
        if self.failure is not None:
            f = self.failure
            lines = [f"trainrun: {f.what}; stopped all {size} rank(s)" if size > 1 else f"trainrun: {f.what}"]
            if f.stderr_tail:
                lines.append(f"trainrun: last lines of rank {f.rank}'s stderr:")
                lines += [f"  | {line}" for line in f.stderr_tail]
            return "\n".join(lines)
        if self.interrupted_by is not None:
            return f"trainrun: interrupted by {signame(self.interrupted_by)}; stopped all {size} rank(s)"
        return None


def exit_code_of(returncode: int) -> int:
    """A rank's returncode as a shell would report it: 128+N for signal N."""
    return returncode if returncode >= 0 else 128 - returncode


def signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
