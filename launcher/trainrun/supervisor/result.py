"""What a finished job amounts to: JobResult (exit code, per-rank return codes, the first failure and its
consequences) and the summary the launcher prints. Pure.

The first failure is the earliest by time across hosts (exit times are taken where the rank ran and put
on the launcher's clock, see fanout/agents.py), not the first one the launcher happened to hear of: a
rank killed on a remote host is reported after the local ranks that failed because of it. Later failures
are listed as consequences. The stderr tail shown for the first failure is its Python traceback when it
printed one (from the last "Traceback" line to the exception line), else its last lines.
"""
from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field

TAIL_SHOWN = 10          # last stderr lines shown when there is no traceback
TRACEBACK_FRAMES = 12    # innermost frames of a traceback shown (2 lines each)
CONSEQUENCES_SHOWN = 8


@dataclass(frozen=True)
class Failure:
    """A failure: a rank's bad exit (or the MPI world, or a host), the exit code it implies, and when
    (`at`: wall-clock seconds on the launcher's clock)."""

    exit_code: int
    what: str
    rank: int | None = None
    stderr_tail: tuple[str, ...] = ()
    at: float = 0.0
    oom: str | None = None


@dataclass
class JobResult:
    """Filled in by the Job as events arrive; final once Job.run() returns."""

    exit_code: int = 0
    returncodes: dict[int, int] = field(default_factory=dict)
    failure: Failure | None = None
    consequences: list[Failure] = field(default_factory=list)
    interrupted_by: int | None = None
    notes: list[str] = field(default_factory=list)  # what came of cleaning up lost hosts (fanout/agents.py)
    may_still_run: int = 0  # ranks on hosts that could not be reached to kill them

    def summary(self, size: int) -> str | None:
        """The failure summary the launcher prints, or None for a clean run."""
        if self.failure is not None:
            f = self.failure
            first = f"{f.what} (the first failure)" if self.consequences else f.what
            lines = [f"trainrun: {first}; {self._stopped(size)}" if size > 1 else f"trainrun: {first}"]
            lines += [f"trainrun: {note}" for note in self.notes]
            if f.oom:
                lines.append(f"trainrun: rank {f.rank}: {f.oom}")
            shown = tail_to_show(f.stderr_tail)
            if shown:
                lines.append(f"trainrun: last lines of rank {f.rank}'s stderr:")
                lines += [f"  | {line}" for line in shown]
            if self.consequences:
                lines.append(f"trainrun: then {len(self.consequences)} more failure(s), probably consequences:")
                for c in self.consequences[:CONSEQUENCES_SHOWN]:
                    last = next((ln.strip() for ln in reversed(c.stderr_tail) if ln.strip()), "")
                    when = f"{c.at - f.at:.2f}s later" if c.at >= f.at else f"{f.at - c.at:.2f}s earlier"  # (named_cause)
                    lines.append(f"  {c.what}, {when}" + (f": {last[:200]}" if last else ""))
                if len(self.consequences) > CONSEQUENCES_SHOWN:
                    lines.append(f"  ... and {len(self.consequences) - CONSEQUENCES_SHOWN} more")
            return "\n".join(lines)
        if self.interrupted_by is not None:
            return "\n".join([f"trainrun: interrupted by {signame(self.interrupted_by)}; {self._stopped(size)}",
                              *(f"trainrun: {note}" for note in self.notes)])
        return None

    def _stopped(self, size: int) -> str:
        if self.may_still_run:
            return f"stopped {size - self.may_still_run} of {size} rank(s)"
        return f"stopped all {size} rank(s)"


def settle(failures: list[Failure], stopped_at: float | None, trigger: Failure | None = None) -> tuple[Failure | None, list[Failure]]:
    """(the first failure, the later ones) by time. Only the failure that made the job stop (`trigger`)
    and failures at or before the moment it began to stop (`stopped_at`) can be the first: later ones
    happened while trainrun was stopping the job. One exception: when the earliest failure's last lines
    say the runtime failed it because another rank stopped ("rank N stopped: ...", the error every other
    rank gets when one exits with an unhandled exception), rank N's own failure is the first, even if it
    exited later (it was still shutting down when the others had already raised)."""
    if not failures:
        return None, []
    ordered = sorted(failures, key=lambda f: f.at)
    candidates = [f for f in ordered if stopped_at is None or f.at <= stopped_at or f is trigger]
    first = candidates[0] if candidates else None
    if first is None:
        return None, []
    first = named_cause(first, ordered)
    return first, [f for f in ordered if f is not first]


_STOPPED = re.compile(r"\btrainrun: rank (\d+) stopped: (.*?)(?:; collectives cannot complete|$)")  # negotiation.py


def named_rank(failure: Failure) -> tuple[int, str] | None:
    """(rank N, its reason) when `failure`'s last lines are the runtime's HorovodInternalError
    "trainrun: rank N stopped: <reason>; ..." (every other rank's error when rank N exits with an
    unhandled exception), else None."""
    for line in reversed([line for line in failure.stderr_tail if line.strip()][-3:]):
        m = _STOPPED.search(line)
        if m is not None:
            return int(m.group(1)), m.group(2)
    return None


_LEFT = re.compile(r"^it left \([^)]*\) (while .+)$")  # negotiation.py's "left" failure


def left_while(failure: Failure) -> tuple[int, str] | None:
    """(rank N, "while rank M waited in allreduce 'x'") when `failure`'s error is the runtime's
    "trainrun: rank N stopped: it left (...) while ...": rank N ended (shut trainrun down) while this
    rank waited in a collective N never joined; else None."""
    named = named_rank(failure)
    if named is None or not (m := _LEFT.match(named[1])):
        return None
    return named[0], m.group(1)


def named_cause(failure: Failure, failures: list[Failure]) -> Failure:
    """The failure of the rank `failure` names as stopped (named_rank), if that rank failed too; else
    `failure` itself."""
    named = named_rank(failure)
    if named is None:
        return failure
    return next((f for f in failures if f.rank == named[0] and f is not failure), failure)


def tail_to_show(tail: tuple[str, ...] | list[str]) -> list[str]:
    """The rank's last Python traceback (header, its innermost frames, the exception line and what
    follows it, a few lines), or else its last TAIL_SHOWN lines."""
    tail = list(tail)
    start = max((i for i, line in enumerate(tail) if line.startswith("Traceback (most recent call last):")), default=None)
    if start is None:
        return tail[-TAIL_SHOWN:]
    end = next((i for i in range(start + 1, len(tail)) if tail[i] and not tail[i].startswith((" ", "\t"))), len(tail) - 1)
    body = tail[start + 1:end]
    if len(body) > 2 * TRACEBACK_FRAMES:
        body = ["  ..."] + body[-2 * TRACEBACK_FRAMES:]
    return [tail[start], *body, *tail[end:end + 4]]


def exit_code_of(returncode: int) -> int:
    """A rank's returncode as a shell would report it: 128+N for signal N."""
    return returncode if returncode >= 0 else 128 - returncode


def signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
