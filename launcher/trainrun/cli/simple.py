"""The plain command line, `trainrun [-np N] PROGRAM [ARGS...]`, read without click; and what both readings
share from the parsed options on (`launch_options`).

Importing click and building the command's ~50 options costs a local launch ~10 ms (docs/benchmarks/launch.md):
more than trainrun's own planning. Most launches are this one form, whose reading is plain: `-np N`
(a whole number >= 1 in ASCII digits) or nothing, then the program, which does not start with `-`, and its
arguments, untouched (the command takes no options after its first argument). For that form `parse` returns
exactly what click would hand the command (`DEFAULTS`, the options' defaults: tests/unit/test_cli_simple.py
checks them and the parse against the click command's own), and `main` runs it as command.main would; for
anything else (another option, a value click would convert or refuse, `--help`, shell completion) it returns
None and command.main reads the line with click. Either way the launch and its messages are the same.
"""
from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

from trainrun.errors import TrainrunError

DEFAULTS: dict[str, Any] = {
    "num_proc": None, "hosts": None, "hostfile": None, "oversubscribe": False, "gpus_per_proc": None,
    "allow_gpu_sharing": False, "bind_to": "none", "export": (), "horovod": None, "prefix": "rank", "output_dir": None,
    "fold": False, "show_ranks": None, "hang_timeout": None, "grace": 3.0, "mpi": "mpich", "tf_cluster": None,
    "start_timeout": None, "ssh_port": None, "ssh_identity_file": None, "ssh_config": None, "ssh_strict": False,
    "ssh_timeout": 15.0, "ssh_parallelism": 64, "heartbeat_timeout": 15.0, "python": None, "workdir": None,
    "network_interface": None, "no_cache": False, "engine": "auto", "max_restarts": None, "min_np": None,
    "max_np": None, "host_discovery_script": None, "blacklist_cooldown_range": None, "elastic_timeout": 600.0,
    "max_backoff": 10.0, "warm_ranks": True, "check": False, "perf": False, "perf_strict": False, "perf_time": None,
    "exclude": None, "dry_run": False, "monitor": False, "verbose": False, "ray": None, "ray_strategy": "pack",
    "cpus_per_proc": None,
}
"""The options the click command (command.cli) is called with when the command line gives none, `json_` aside."""

COMPLETE_VAR = "_TRAINRUN_COMPLETE"  # click's shell-completion request for prog_name "trainrun"


def parse(argv: list[str]) -> tuple[tuple[str, ...], dict[str, Any]] | None:
    """(command, options) for `[-np N] PROGRAM [ARGS...]` as click would read it, else None."""
    if os.environ.get(COMPLETE_VAR):
        return None
    options = dict(DEFAULTS)
    rest = argv
    if rest[:1] in (["-np"], ["--num-proc"]) and len(rest) >= 2:
        value = rest[1]
        if not (value.isascii() and value.isdigit() and int(value) >= 1):
            return None
        options["num_proc"] = int(value)
        rest = rest[2:]
    if not rest or rest[0].startswith("-"):
        return None
    return tuple(rest), options


def launch_options(command: tuple[str, ...], json_: bool, options: dict[str, Any]) -> int:
    """The launch of the parsed command line (click's or `parse`'s): LaunchConfig, then launch; the exit code."""
    from trainrun.config import parse_config
    from trainrun.launch import launch

    if options["verbose"]:
        from trainrun import log

        log.enable_verbose()
    try:
        return launch(parse_config(command, json=json_, **options))
    except BrokenPipeError:  # a table, report or summary written after the reader left (`| head`): as SIGPIPE
        from trainrun.supervisor.output import SIGPIPE_EXIT, reader_gone

        if not (reader_gone(1) or reader_gone(2)):
            raise
        return SIGPIPE_EXIT


def answer_sigint() -> None:
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started with SIGINT ignored (`trainrun ... &` in a script: the shell does that): Python then leaves it
        # ignored, so Ctrl-C / kill -INT did nothing until the Job installed its own handler after planning.
        # Answer it in every phase alike: planning and reaching hosts stop at once (exit 130).
        signal.signal(signal.SIGINT, signal.default_int_handler)


def exit_with(code: int | None) -> NoReturn:
    if code == 141:  # SIGPIPE_EXIT (supervisor/output.py): no BrokenPipeError from the interpreter's last flush
        from trainrun.supervisor.output import silence_closed_outputs

        silence_closed_outputs()
    sys.exit(code or 0)


def main(argv: list[str]) -> None:
    """Run `argv` and exit (SystemExit) if it is the plain form; return None (having done nothing) if not.
    What command.main does around click's call, for this form: an error as one line and its code; an
    interrupt while planning as click reports it (a blank line on stderr, exit 130); a broken pipe nobody
    reported as click ends it (exit 1, later flushes silenced)."""
    parsed = parse(argv)
    if parsed is None:
        return
    command, options = parsed
    answer_sigint()
    try:
        try:
            code = launch_options(command, False, options)
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr, flush=True)  # click.echo(file=sys.stderr) before its Abort
            code = 130
        except OSError as err:
            import errno

            if err.errno != errno.EPIPE:
                raise
            from click.utils import _PacifyFlushWrapper  # what click does with an EPIPE it is handed

            sys.stdout = _PacifyFlushWrapper(sys.stdout)
            sys.stderr = _PacifyFlushWrapper(sys.stderr)
            sys.exit(1)
    except TrainrunError as err:
        print(f"trainrun: error: {err}", file=sys.stderr)
        code = err.exit_code
    exit_with(code)
