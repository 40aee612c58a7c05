"""The command line: the only place raw argv and YAML are seen (command.py: the click command and
`main`, which turns every TrainrunError into one line and its exit code; config.py: LaunchConfig, the
typed and validated value every later layer receives).

`main` here is the trainrun process's own entry point (the `trainrun` console script, `python -m trainrun`):
the plain form `[-np N] PROGRAM ...` without click (simple.py), else command.main, then the process ends at
once (`exit_now`). Code that runs the command inside a process of its
own making and must see its SystemExit (horovodrun's temporary folder, tests) calls command.main."""
from __future__ import annotations

import os
import sys
from typing import NoReturn

__all__ = ["main"]


def main(argv: list[str] | None = None) -> NoReturn:
    from trainrun.cli import simple

    try:
        simple.main(sys.argv[1:] if argv is None else argv)  # the plain form, without click (exits if it was)
        from trainrun.cli.command import main as run

        run(argv)
    except SystemExit as done:
        exit_now(done)
    raise AssertionError("command.main returned")  # pragma: no cover (it always raises SystemExit)


def exit_now(done: SystemExit) -> NoReturn:
    """End the process with `done`'s code, without the interpreter's finalization: by the time the launcher's
    command returns, its job is over (every rank reaped, its guardian gone, every file it wrote closed), and
    tearing down ~200 modules' objects one by one is ~10% of a local launch's time (docs/benchmarks/launch.md).
    What the finalization would do that anyone can see is done first, as the interpreter does it: wait for
    non-daemon threads, run the atexit handlers, flush stdout and stderr. Where that cannot be done the same
    way (a non-daemon thread still running, a code that is not a number, a flush that fails: the interpreter
    reports that and exits 120), `done` is raised and the interpreter ends the process as before."""
    code = done.code
    if code is not None and (not isinstance(code, int) or isinstance(code, bool)):
        raise done
    threading = sys.modules.get("threading")
    if threading is not None and any(t.is_alive() and not t.daemon for t in threading.enumerate()
                                     if t is not threading.main_thread()):
        raise done
    import atexit

    atexit._run_exitfuncs()  # (and forgets them: a fallback below does not run them twice)
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except BaseException:
        raise done from None
    os._exit((code or 0) & 0xFF)
