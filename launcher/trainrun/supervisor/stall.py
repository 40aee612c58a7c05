"""Naming the cause when ranks wait in a collective that cannot complete. Pure.

A rank's runtime reports *stuck* (diag/rankhook.py, relayed as `on_stall(rank, stuck)`) when it has
waited in a collective for the stall timeout while no collective round completed: some rank's engine
takes no part at all, which no rank can end from inside (MPI cannot cancel a collective, and
MPI_Finalize waits for every rank). The Job takes every running rank's stack, then ends the job with
`describe`'s message: the ranks that neither reported being stuck nor are, by their stack, inside a
trainrun call are the absent ones, and each is named by what the launcher knows of it -- its exit ("exited 0": a rank that left without shutting
trainrun down, e.g. `os._exit`), its /proc state from the stack dump ("is stopped (state T)"), or else
that it runs but takes no part (its stack is printed above the message).
"""
from __future__ import annotations

from collections.abc import Callable, Set as AbstractSet
from dataclasses import dataclass

from trainrun.diag.stacks import SILENT_STATES
from trainrun.rankset import describe_ranks
from trainrun.supervisor.result import signame

STALL_EXIT = 1  # as a rank's unhandled StallError would give


@dataclass(frozen=True)
class Stuck:
    """One rank's report: it waited `seconds` in `waiting` ("allreduce 'x'") with no round completing."""

    rank: int
    seconds: float
    waiting: str

    @classmethod
    def parse(cls, rank: int, text: str) -> Stuck | None:
        """From the notice's text, "SECONDS WHAT" (None if it is not that)."""
        seconds, _, waiting = text.partition(" ")
        try:
            return cls(rank, float(seconds), waiting or "a collective")
        except ValueError:
            return None


def absence(returncode: int | None, state: str) -> str:
    """How an absent rank is described: by its exit, else its /proc state, else as running."""
    if returncode is not None:
        if returncode >= 0:
            return f"exited {returncode}" if returncode == 0 else f"exited with code {returncode}"
        return f"was killed by {signame(-returncode)}"
    if state in SILENT_STATES:
        return SILENT_STATES[state]
    return "took no part in it (it runs: its stack is above)"


def describe(stuck: list[Stuck], ranks: list[int], returncodes: dict[int, int], states: dict[int, str],
             where: Callable[[int], str], in_call: AbstractSet[int] = frozenset()) -> tuple[str, int]:
    """(the failure's message, the rank it is about) for the stuck reports `stuck` (the first one first)
    of a job of `ranks`; `where(rank)` names a rank with its host ("rank 1 on h2 (local rank 1)").
    `in_call`: ranks whose stack shows them inside a trainrun call: waiting too, though their own
    report may not have come yet (each rank's watchdog looks once a second)."""
    first = stuck[0]
    waiting = sorted({s.rank for s in stuck} | (set(in_call) - set(returncodes)))
    absent = [r for r in ranks if r not in waiting]
    during = f"{describe_ranks(waiting)} waited in {first.waiting}"
    if not absent:
        return (f"{during} and no collective round completed for {first.seconds:g} s, though every rank "
                "waits (MPI delivers nothing: see the stacks above)", first.rank)
    hows: dict[str, list[int]] = {}
    for r in absent:
        hows.setdefault(absence(returncodes.get(r), states.get(r, "")), []).append(r)
    (how, who), *others = sorted(hows.items(), key=lambda kv: kv[1][0])
    lead = where(who[0]) if len(who) == 1 else describe_ranks(who)
    verb = how if len(who) == 1 or not how.startswith("is ") else "are " + how[3:]
    also = "".join(f"; {describe_ranks(rs)} {h if len(rs) == 1 or not h.startswith('is ') else 'are ' + h[3:]}"
                   for h, rs in others)
    return (f"{lead} {verb} while {during} (no collective round completed for {first.seconds:g} s){also}", who[0])
