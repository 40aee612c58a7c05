"""The one error hierarchy of trainrun.

Every error a user can cause or meet derives from TrainrunError, carries the exit code the launcher
returns for it, and renders as one line (`trainrun: error: ...`) with no traceback. Exit codes are
distinct per kind so scripts can tell them apart:

    2    usage: bad flag, value, hostfile line or config key (click's convention)
    3    a host could not be reached or set up (SSH stages, remote agent)
    4    the connectivity check found the job cannot run
    124  ranks did not join the MPI world in time (--start-timeout: mpiworld/world.py) or hung
         (--hang-timeout: supervisor/job.py); a job's result, no exception of this module
    126  program found but not executable (shell convention)
    127  program not found (shell convention; a missing `.py` program too)

A job whose ranks ran exits with the first failing rank's code (128+N for signal N), so these codes
are only promised for failures before any rank ran.
"""
from __future__ import annotations


class TrainrunError(Exception):
    """Root of all user-facing errors. `str(err)` is the whole one-line message."""

    exit_code = 1

    def __init__(self, message: str, *, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(TrainrunError):
    """A flag, value, hostfile or config the user gave is wrong; the message names which and where."""

    exit_code = 2


class ProgramError(TrainrunError):
    """The program to launch is missing (127) or not executable (126)."""

    exit_code = 127


class HostError(TrainrunError):
    """A host could not be reached or prepared. `host` and `stage` say where it failed: dns, tcp, ssh, hostkey,
    auth (fanout/ssh.py), python (no interpreter there: fanout/python_pick.py), agent."""

    exit_code = 3

    def __init__(self, host: str, stage: str, message: str, *, hint: str = ""):
        self.host, self.stage, self.message, self.hint = host, stage, message, hint
        text = f"{host}: {stage}: {message}"
        super().__init__(f"{text} ({hint})" if hint else text)


class HostsError(TrainrunError):
    """Several hosts failed; keeps every per-host cause (a fabric-style aggregate)."""

    exit_code = 3

    def __init__(self, failures: list[HostError]):
        self.failures = failures
        first = failures[0]
        more = f" (and {len(failures) - 1} more host(s): {', '.join(f.host for f in failures[1:])})" if len(failures) > 1 else ""
        super().__init__(f"{first}{more}")


class CheckFailed(TrainrunError):
    """`--check` (or the check before a launch) found that the job cannot run."""

    exit_code = 4
