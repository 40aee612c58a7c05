"""The MPI world's name and its shared-memory segments: MPICH names its /dev/shm segments after the
job's KVS name, and killed or aborted ranks leak them, so every host's agent removes its job's
segments at teardown. Pure naming plus one unlinking function."""
from __future__ import annotations

import os
import re


def kvsname_for(job_id: str) -> str:
    """The job's KVS name, `trainrun_<job id>`: every host derives it from the job id, so each agent can
    remove the job's shared-memory segments on its own host.

    Uniqueness matters: MPICH names its shared-memory segments after the KVS name, and a segment left by
    a killed job with the same name breaks the next one; job ids are random (48 bits). Characters outside
    `[A-Za-z0-9_.-]` become `_`.
    """
    return "trainrun_" + re.sub(r"[^A-Za-z0-9_.-]", "_", job_id)[:64]


def world_id(kvsname: str) -> int:
    """MPICH's `MPIR_Process.world_id`: 32-bit FNV-1a of the KVS name (uthash's HASH_FNV)."""
    h = 2166136261
    for byte in kvsname.encode():
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    return h


def shm_segment_pattern(kvsname: str) -> re.Pattern[str]:
    """Names MPICH (ch4 POSIX shm) gives this job's segments: `mpich_{shm,vci}_<world_id hex>_<node id>`."""
    return re.compile(r"mpich_(?:shm|vci)_%x_\d+" % world_id(kvsname))


def remove_shm_segments(kvsname: str, shm_dir: str = "/dev/shm") -> list[str]:
    """Unlink this job's MPICH segments in `shm_dir` (killed or aborted ranks leak them); return their paths.

    Safe at any time after the job's ranks are dead, also after a crash; other jobs' segments are kept.
    Segments vanishing meanwhile are ignored.
    """
    pattern, removed = shm_segment_pattern(kvsname), []
    for name in sorted(os.listdir(shm_dir)):
        if pattern.fullmatch(name):
            path = os.path.join(shm_dir, name)
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            removed.append(path)
    return removed
