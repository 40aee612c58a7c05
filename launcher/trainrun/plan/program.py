"""Turn the user's command into the argv a rank runs, checking it exists on this machine.

`train.py args` runs with the launcher's interpreter (or --python for remote hosts); anything else
runs as given. Missing program -> ProgramError 127, not executable -> 126 (shell conventions).
"""
from __future__ import annotations

import os
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
    if not on_path(prog):
        raise ProgramError(f"program {prog}: not found on PATH", exit_code=127)


def on_path(name: str) -> bool:
    """Whether `shutil.which(name)` finds the program `name` (no slash in it)."""
    return which(name) is not None


def which(name: str) -> str | None:
    """`shutil.which(name)` for a program name without a slash: the same search (PATH, else the system's default
    path; the first executable file that is not a directory), without importing shutil, which brings bz2, lzma
    and zlib: ~3 ms of every launch (tests/unit/test_program_which.py compares the two)."""
    path = os.environ.get("PATH")
    if path is None:
        try:
            path = os.confstr("CS_PATH")
        except (AttributeError, ValueError):
            path = os.defpath
    if not path:
        return None
    for d in dict.fromkeys(path.split(os.pathsep)):
        f = os.path.join(d, name)
        if os.path.exists(f) and os.access(f, os.X_OK) and not os.path.isdir(f):
            return f
    return None
