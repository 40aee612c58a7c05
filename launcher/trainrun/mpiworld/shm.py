"""The MPI world's name and its shared-memory segments: MPICH names its /dev/shm segments after the
job's KVS name, and killed or aborted ranks leak them, so every host's agent removes its job's
segments at teardown. Pure naming plus one unlinking function; and how much room the world needs there
(measured: SHM_PER_RANK_BYTES), checked before any rank starts (supervisor/assemble.py)."""
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


# What MPICH's ch4 POSIX shared memory takes in /dev/shm on a host with L ranks of the job: one segment of
# SHM_BASE_BYTES + L * SHM_PER_RANK_BYTES, every page of it written at MPI_Init (a rank that touches a page the
# tmpfs has no room for gets SIGBUS). Measured with MPICH 5.0.2 (mpi4py's wheel), `trainrun -np L` of a
# trainrun.numpy program after init() and one allreduce: L=1: 1,061,440 bytes, L=2: 2,118,784, L=4: 4,233,472,
# L=8: 8,462,848, i.e. 4096 + L x 1,057,344 exactly (its eager queue, 64 cells of 16 KiB per rank, and headers).
SHM_BASE_BYTES = 4096
SHM_PER_RANK_BYTES = 1_057_344
MIB = 1 << 20


def shm_free(shm_dir: str = "/dev/shm") -> int | None:
    """Bytes this process can still write to `shm_dir` now; None when it cannot be read (no such mount)."""
    try:
        st = os.statvfs(shm_dir)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def shm_need(local_ranks: int) -> int:
    """Bytes of /dev/shm the MPI world needs on a host with `local_ranks` ranks (the measurement above). Pure."""
    return SHM_BASE_BYTES + local_ranks * SHM_PER_RANK_BYTES if local_ranks > 0 else 0


def shm_shortage(host: str, free: int | None, local_ranks: int) -> str | None:
    """The line saying that `host`'s /dev/shm (`free` bytes; None: unknown) is too small for the MPI world of
    its `local_ranks` ranks, or None when it is big enough or unknown (never fail on a guess). Pure."""
    need = shm_need(local_ranks)
    if free is None or free >= need:
        return None
    return (f"{host}: /dev/shm has {_mib(free)} MiB free, the MPI world needs {_mib(need, up=True)} MiB for its "
            f"{local_ranks} rank(s) there (free space there, e.g. remove old /dev/shm files, or run fewer ranks "
            "on it; MPI ranks would die of SIGBUS)")


def _mib(n: int, up: bool = False) -> str:
    """`n` bytes in MiB, to 0.1, rounded down (what is free) or up (what is needed), so the two never look equal."""
    tenths = -(-n * 10 // MIB) if up else n * 10 // MIB
    return f"{tenths / 10:g}" if tenths % 10 else str(tenths // 10)
