"""The launcher's log: `info` lines only with -v, `warning` lines always, both to stderr as
`trainrun: ...`. A few lines instead of the logging package, which would cost a local launch ~7 ms
of imports for messages it usually does not print."""
from __future__ import annotations

import sys

verbose = False


def enable_verbose() -> None:
    global verbose
    verbose = True


def info(message: str, *args: object) -> None:
    if verbose:
        _write(message % args if args else message)


def warning(message: str, *args: object) -> None:
    _write(message % args if args else message)


def _write(text: str) -> None:
    try:
        sys.stderr.write(f"trainrun: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
