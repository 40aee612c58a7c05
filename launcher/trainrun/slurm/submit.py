"""`trainrun --sbatch [SBATCH OPTIONS...] [TRAINRUN OPTIONS...] PROGRAM ...`: split the command line, write
the batch script (sbatch.py) and submit it; `--wait` follows the job and returns its exit code.

The sbatch options run from `--sbatch` to the first of trainrun's own options (or `--`); trainrun's
options and the program go into the script, which runs trainrun inside the allocation, where it takes
hosts and slots from Slurm (fanout/select.py).
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence

from trainrun.errors import TrainrunError, UsageError
from trainrun.slurm.sbatch import SbatchOptionError, build_script, job_id, sbatch_argv


@dataclass(frozen=True)
class Submission:
    sbatch_options: tuple[str, ...]
    trainrun_args: tuple[str, ...]
    wait: bool


def split_argv(argv: Sequence[str], options: Mapping[str, bool]) -> Submission:
    """argv after `--sbatch`. `options`: trainrun's option names -> whether each takes a value. Pure.
    `--wait` among trainrun's options (before the program) is the submission's, not the script's."""
    i = 0
    while i < len(argv) and argv[i] != "--" and argv[i].split("=", 1)[0] not in options:
        i += 1
    sb, rest = list(argv[:i]), list(argv[i + 1:] if i < len(argv) and argv[i] == "--" else argv[i:])
    wait, j = False, 0
    while j < len(rest) and rest[j].startswith("-"):
        name = rest[j].split("=", 1)[0]
        if name == "--wait":
            wait = True
            del rest[j]
            continue
        j += 2 if options.get(name) and "=" not in rest[j] else 1
    return Submission(tuple(sb), tuple(rest), wait)


def submit(sub: Submission, python: str = sys.executable) -> int:
    """Submit; print the job id. With wait: block until the job ends and return its exit code (sbatch's)."""
    try:
        script = build_script(sub.sbatch_options, sub.trainrun_args, python)
    except SbatchOptionError as err:
        raise UsageError(f"--sbatch: {err}") from None
    try:
        proc = subprocess.Popen(sbatch_argv(sub.wait), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    except FileNotFoundError:
        raise TrainrunError("--sbatch: no sbatch on PATH; run it where Slurm's commands are", exit_code=3) from None
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None  # all three are PIPEs
    proc.stdin.write(script)
    proc.stdin.close()
    first = proc.stdout.readline()  # --parsable prints the id at submission, before --wait blocks
    try:
        jid = job_id(first)
    except ValueError:
        proc.wait()
        said = proc.stderr.read().strip().splitlines()
        raise TrainrunError(f"--sbatch: sbatch refused the job: {said[-1] if said else first.strip() or 'no output'}",
                            exit_code=3) from None
    print(f"trainrun: submitted batch job {jid}" + (" (waiting for it to end)" if sub.wait else ""), flush=True)
    code = proc.wait()
    if sub.wait:
        print(f"trainrun: batch job {jid} ended with exit code {code}", file=sys.stderr, flush=True)
        return code
    return 0
