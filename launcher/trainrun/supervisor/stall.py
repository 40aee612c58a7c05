"""Naming the cause when ranks wait in a collective that cannot complete. Pure.

Two reports from a rank's runtime (runtime/rankhook.py, relayed as `on_stall(rank, notice)`) mean the job
cannot go on, and the Job ends it after taking every running rank's stack:
- *stuck* ("stuck SECONDS WHAT"): the rank has waited in WHAT for the stall timeout while no collective
  round completed: some rank's engine takes no part at all, which no rank can end from inside (MPI cannot
  cancel a collective, and MPI_Finalize waits for every rank);
- *stall* ("stall RANKS SECONDS NAMES"): the rank's StallError: RANKS did not submit NAMES within the
  stall timeout, while their engines still take part in rounds (a rank spinning or blocked outside
  trainrun: a deadlocked DataLoader, a sleep, I/O). The raising ranks may then hang in their own
  shutdown (MPI_Finalize waits for the absent rank), so the launcher, not the program, ends the job.

`describe` builds the failure's message: a stall names its absent ranks; for a stuck report, the ranks
that neither reported nor are, by their stack, inside a trainrun call are the absent ones. Each is
named by what the launcher knows of it -- its exit ("exited 0": a rank that left without shutting
trainrun down, e.g. `os._exit`), its /proc state from the stack dump ("is stopped (state T)"), that it
waits in another collective, or else that it runs but takes no part (its stack is printed above).
"""
from __future__ import annotations

from collections.abc import Callable, Set as AbstractSet
from dataclasses import dataclass

from trainrun.diag.stacks import SILENT_STATES
from trainrun.rankset import describe_ranks, parse_ranks
from trainrun.supervisor.result import signame

STALL_EXIT = 1  # as a rank's unhandled StallError would give


@dataclass(frozen=True)
class Stuck:
    """One rank's report: it waited `seconds` in `waiting` ("allreduce 'x'", or for a stall the names:
    "'x'"); `absent`: for a stall, the ranks that did not submit (None for a stuck report)."""

    rank: int
    seconds: float
    waiting: str
    absent: frozenset[int] | None = None

    @classmethod
    def parse(cls, rank: int, text: str) -> Stuck | None:
        """From the notice's text, "stuck SECONDS WHAT" or "stall RANKS SECONDS NAMES" (None if it is
        neither)."""
        word, _, rest = text.partition(" ")
        try:
            if word == "stuck":
                seconds, _, waiting = rest.partition(" ")
                return cls(rank, float(seconds), waiting or "a collective")
            if word == "stall":
                ranks, seconds, waiting = rest.split(" ", 2)
                return cls(rank, float(seconds), waiting, parse_ranks(ranks))
        except ValueError:
            pass
        return None


def absence(returncode: int | None, state: str, in_call: bool = False) -> str:
    """How an absent rank is described: by its exit, else its /proc state, else by its stack (inside
    another trainrun call, or running elsewhere)."""
    if returncode is not None:
        if returncode >= 0:
            return f"exited {returncode}" if returncode == 0 else f"exited with code {returncode}"
        return f"was killed by {signame(-returncode)}"
    if state in SILENT_STATES:
        return SILENT_STATES[state]
    if in_call:
        return "waits in another collective (its stack is above)"
    return "took no part in it (it runs: its stack is above)"


def describe(stuck: list[Stuck], ranks: list[int], returncodes: dict[int, int], states: dict[int, str],
             where: Callable[[int], str], in_call: AbstractSet[int] = frozenset()) -> tuple[str, int]:
    """(the failure's message, the rank it is about) for the reports `stuck` (the first one first) of a
    job of `ranks`; `where(rank)` names a rank with its host ("rank 1 on h2 (local rank 1)").
    `in_call`: ranks whose stack shows them inside a trainrun call: waiting too, though their own
    report may not have come yet (each rank's watchdog looks once a second), unless a stall names them."""
    first = stuck[0]
    reporters = {s.rank for s in stuck}
    named = set().union(*(s.absent for s in stuck if s.absent is not None)) - reporters
    if named:  # a StallError said who did not submit
        absent = sorted(named)
        waiting = sorted(reporters | (set(in_call) - set(returncodes) - named))
        why = f"not submitted by {describe_ranks(absent)} within the {first.seconds:g} s stall timeout"
    else:
        waiting = sorted(reporters | (set(in_call) - set(returncodes)))
        absent = [r for r in ranks if r not in waiting]
        why = f"no collective round completed for {first.seconds:g} s"
    during = f"{describe_ranks(waiting)} waited in {first.waiting}"
    if not absent:
        return (f"{during} and {why}, though every rank waits (MPI delivers nothing: see the stacks above)",
                first.rank)
    hows: dict[str, list[int]] = {}
    for r in absent:
        hows.setdefault(absence(returncodes.get(r), states.get(r, ""), r in in_call), []).append(r)
    (how, who), *others = sorted(hows.items(), key=lambda kv: kv[1][0])
    lead = where(who[0]) if len(who) == 1 else describe_ranks(who)
    also = "".join(f"; {describe_ranks(rs)} {_plural(h, len(rs))}" for h, rs in others)
    return f"{lead} {_plural(how, len(who))} while {during} ({why}){also}", who[0]


def _plural(how: str, count: int) -> str:
    """"is stopped ..." for one rank, "are stopped ..." for several."""
    return "are " + how[3:] if count > 1 and how.startswith("is ") else how
