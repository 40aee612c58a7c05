"""GPUs of this machine, from nvidia-smi (none when it is absent or fails).

A CUDA_VISIBLE_DEVICES already set limits the pool to the GPUs it names; GPU ids are the host's
(nvidia-smi index, or the entries of that CUDA_VISIBLE_DEVICES), and TRAINRUN_GPUS uses the same ids.
"""
from __future__ import annotations

import os
import subprocess

from trainrun.plan.facts import Gpu
from trainrun.plan.program import which


def query_nvidia_smi(timeout: float = 10.0) -> list[Gpu]:
    exe = which("nvidia-smi")  # (shutil.which's search, without importing shutil: plan/program.py)
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_nvidia_smi(out)


def parse_nvidia_smi(text: str) -> list[Gpu]:
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            mem = int(parts[2]) if parts[2].isdigit() else 0
            gpus.append(Gpu(int(parts[0]), parts[1], mem))
    return gpus


def gpu_pool(gpus: list[Gpu], cuda_visible: str | None) -> tuple[int, ...]:
    """The GPU ids ranks may be given: all detected, or those a pre-set CUDA_VISIBLE_DEVICES names."""
    ids = tuple(g.index for g in gpus)
    if cuda_visible is None:
        return ids
    wanted = [v.strip() for v in cuda_visible.split(",") if v.strip()]
    return tuple(int(v) for v in wanted if v.isdigit() and int(v) in ids)


def local_gpu_pool() -> tuple[int, ...]:
    return gpu_pool(query_nvidia_smi(), os.environ.get("CUDA_VISIBLE_DEVICES"))
