"""Turn the user's command into the argv a rank runs, checking it exists on this machine.

`train.py args` runs with the launcher's interpreter (or --python for remote hosts); anything else
runs as given. Missing program -> ProgramError 127, not executable -> 126 (shell conventions).
"""
from __future__ import annotations

import os
import shutil
import sys

from trainrun.errors import ProgramError, UsageError


def command_argv(command: tuple[str, ...], python: str | None = None) -> tuple[str, ...]:
    """argv for the ranks: `.py` programs get the interpreter in front. Pure."""
    if not command:
        raise UsageError("no program given; write e.g. trainrun -np 2 train.py")
    if command[0].endswith(".py"):
        return (python or sys.executable, *command)
    return tuple(command)


def check_local_program(command: tuple[str, ...]) -> None:
    """Raise ProgramError if the program cannot run on this machine."""
    prog = command[0]
    if prog.endswith(".py"):
        if not os.path.isfile(prog):
            raise ProgramError(f"program {prog}: no such file (from {os.getcwd()})", exit_code=127)
        if not os.access(prog, os.R_OK):
            raise ProgramError(f"program {prog}: not readable", exit_code=126)
        return
    if "/" in prog:
        if not os.path.exists(prog):
            raise ProgramError(f"program {prog}: no such file", exit_code=127)
        if os.path.isdir(prog) or not os.access(prog, os.X_OK):
            raise ProgramError(f"program {prog}: not executable (chmod +x it, or run it with its interpreter)", exit_code=126)
        return
    if shutil.which(prog) is None:
        raise ProgramError(f"program {prog}: not found on PATH", exit_code=127)
