"""The per-job, per-host directory of the ranks' stack files (the faulthandler fallback, runtime/rankhook.py).

One directory per job and host, made by the owner of the host's ranks (LocalRanks.start: the launcher for
its own host, the agent elsewhere) and named to each rank by STACKS_DIR_ENV, so that whoever cleans up after
the ranks removes their files with it even when no rank could (a SIGKILLed rank runs no atexit): the owner
when its ranks are reaped, its Watchdog when the owner dies, and the reaper that a launcher runs on a lost
host (supervisor/reaper.py), which knows only the job id and the host: hence a name derived from them.

A module of its own, stdlib's os/re/stat only: every launch makes and removes one, and diag/stacks.py (taking
stacks) would cost its start-up ~4 ms of imports (scripts/bench_launch.py).
"""
from __future__ import annotations

import os
import re
import stat

STACKS_DIR_ENV = "TRAINRUN_STACKS_DIR"


def temp_root() -> str:
    """The temporary directory the owner, its watchdog and a reaper agree on: $TMPDIR, $TEMP or $TMP when it
    is a directory, else /tmp (tempfile.gettempdir's order, without importing tempfile)."""
    for name in ("TMPDIR", "TEMP", "TMP"):
        path = os.environ.get(name)
        if path and os.path.isdir(path):
            return path
    return "/tmp"


def stacks_dir(job_id: str, host: str, tmp: str | None = None) -> str:
    """The stack-file directory of job `job_id`'s ranks on `host` (the host's mark, reaper.py): a
    `trainrun-stacks-JOB-HOST` directory in `tmp` (default: temp_root()). Characters outside [A-Za-z0-9_.-]
    become `_`. Pure but for the default."""
    def safe(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:64]

    return os.path.join(tmp or temp_root(), f"trainrun-stacks-{safe(job_id)}-{safe(host)}")


def make_stacks_dir(job_id: str, host: str) -> str | None:
    """Make job `job_id`'s stack-file directory on `host` (mode 0700) and return it; an existing one is used if
    it is a real directory of this user (the same owner starting a rank again). None when neither works (the
    ranks then keep their files in the temporary directory, as without an owner)."""
    path = stacks_dir(job_id, host)
    try:
        os.mkdir(path, 0o700)
        return path
    except FileExistsError:
        st = os.lstat(path)
        # not a symlink or a file someone put there: the name is guessable once the job id is known
        return path if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() else None
    except OSError:
        return None


def remove_stacks_dir(job_id: str, host: str) -> None:
    """Remove job `job_id`'s stack-file directory on `host` and the files in it, if it is there: after the
    ranks that wrote them are dead. The ranks write files only (one each), so no tree walk; a symlink inside
    is removed, never followed. Never raises."""
    path = stacks_dir(job_id, host)
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    os.unlink(entry.path)
                except OSError:  # (a directory someone made in it: left, and so is this one)
                    pass
        os.rmdir(path)
    except OSError:
        pass
