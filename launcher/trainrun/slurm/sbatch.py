"""`trainrun --sbatch [SBATCH OPTIONS...] -np N train.py`: the batch script and the `sbatch` command line.

build_script(options, trainrun_args, python) is the script: `#SBATCH` lines from the options, then one shlex-quoted
line that runs `python -m trainrun ARGS` inside the allocation (the same interpreter that submitted it, so the
same trainrun). sbatch runs it in the submit directory with the submitter's environment (its default
--export=ALL), and trainrun then takes hosts and slots from the allocation.

sbatch_argv(wait) is the command that submits it: the script goes to sbatch's stdin (no file to write or clean
up); `--parsable` makes sbatch print `JOBID` or `JOBID;CLUSTER` (job_id() reads it) as soon as the job is
queued. With wait=True, `--wait` keeps sbatch until the job ends and sbatch exits with the job's exit code (1 when
the job ended by a signal). Checked against Slurm 22.05 in tests/cluster/test_slurm_sbatch.py.
"""
from __future__ import annotations

import shlex
from collections.abc import Sequence

# Options that make no sense for a script trainrun writes: they replace or drop the script.
REFUSED = ("--wrap", "--help", "--usage", "--version", "-h", "-V")


class SbatchOptionError(ValueError):
    """An sbatch option trainrun cannot put in its script; the message names it."""


def directive_lines(options: Sequence[str]) -> list[str]:
    """`#SBATCH` lines for sbatch options given as argv tokens: an option and the values after it that do not
    start with '-' share a line (`-N 3` -> `#SBATCH -N 3`, `--time=10` -> `#SBATCH --time=10`); tokens are
    shell-quoted, which sbatch's #SBATCH parser understands (`--job-name='a b'`)."""
    lines: list[list[str]] = []
    for tok in options:
        if tok.startswith("-") and tok != "-":
            name = tok.split("=", 1)[0]
            if name in REFUSED:
                raise SbatchOptionError(f"sbatch option {name} cannot be used with --sbatch "
                                        "(trainrun writes the script itself)")
            lines.append([tok])
        elif lines:
            lines[-1].append(tok)
        else:
            raise SbatchOptionError(f"expected an sbatch option before {tok!r}")
        if "\n" in tok:
            raise SbatchOptionError(f"line break in sbatch option {tok!r}")
    return ["#SBATCH " + " ".join(shlex.quote(t) for t in line) for line in lines]


def build_script(options: Sequence[str], trainrun_args: Sequence[str], python: str) -> str:
    """The batch script text: shebang, #SBATCH lines, and `exec PYTHON -m trainrun ARGS` (quoted).
    trainrun_args are trainrun's arguments without --sbatch and its options (`-np 6 train.py --lr 0.1`)."""
    if not trainrun_args:
        raise SbatchOptionError("nothing to run: give the program after the sbatch options")
    command = " ".join(shlex.quote(a) for a in (python, "-m", "trainrun", *trainrun_args))
    return "\n".join([
        "#!/bin/sh",
        *directive_lines(options),
        "# Written by trainrun --sbatch: trainrun takes hosts and slots from this job's allocation.",
        f"exec {command}",
        "",
    ])


def sbatch_argv(wait: bool = False) -> list[str]:
    """argv that submits the script given on its stdin; prints the job id (see job_id) right away, and with
    wait=True returns only when the job has ended, with the job's exit code."""
    return ["sbatch", "--parsable", *(["--wait"] if wait else [])]


def job_id(parsable_stdout: str) -> str:
    """The job id from `sbatch --parsable` output (`123` or `123;cluster`); ValueError when there is none."""
    first = parsable_stdout.strip().splitlines()[0] if parsable_stdout.strip() else ""
    jid = first.split(";", 1)[0].strip()
    if not jid.isdigit():
        raise ValueError(f"sbatch printed no job id: {parsable_stdout.strip()[:200]!r}")
    return jid
