"""The `horovodrun` command: Horovod 0.28.1's command line, run by trainrun's launcher.

translate.py turns horovodrun's argv into trainrun's (pure; options.py is the parser, config_file.py
reads --config-file, build.py answers --check-build); `main` prints the notes and runs trainrun's own
command in this process -- one launcher, the same output, teardown and exit codes. docs/guides/horovod.md.
"""
from __future__ import annotations

import os
import sys


def _wrap_discovery(slots: int, script: str, folder: str) -> str:
    """An executable in `folder` that runs `script` and gives bare hosts `slots` slots (slots.py)."""
    import shlex

    path = os.path.join(folder, "discover")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m trainrun.horovodrun.slots {slots} "
                f"{shlex.quote(os.path.abspath(script))}\n")
    os.chmod(path, 0o700)
    return path


def main(argv: list[str] | None = None) -> None:
    from trainrun.errors import UsageError
    from trainrun.horovodrun.translate import HOROVOD_API_VERSION, translate

    argv = sys.argv[1:] if argv is None else argv
    try:
        t = translate(argv, os.environ)
    except UsageError as err:
        print(f"horovodrun: error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    if t.action == "help":
        from trainrun.horovodrun.options import build_parser

        print(build_parser().format_help())
        sys.exit(0)
    if t.action in ("version", "check-build"):
        from trainrun.version import __version__

        if t.action == "version":
            print(f"{HOROVOD_API_VERSION} (trainrun {__version__})")
        else:
            from trainrun.horovodrun.build import build_facts, check_build_text

            print(check_build_text(build_facts(), HOROVOD_API_VERSION, __version__))
        sys.exit(0)
    for note in t.notes:
        print(f"horovodrun: {note}", file=sys.stderr)
    sys.stderr.flush()
    from trainrun.cli.command import main as trainrun_main

    if t.slots_per_host is None:
        trainrun_main(list(t.argv))
    import tempfile

    with tempfile.TemporaryDirectory(prefix="horovodrun-") as folder:
        script = t.argv[t.argv.index("--host-discovery-script") + 1]
        trainrun_main(list(t.with_discovery_script(_wrap_discovery(t.slots_per_host, script, folder)).argv))
