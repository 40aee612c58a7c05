"""Gradient buckets: which parameters DistributedOptimizer reduces together when the user names no groups.

Why: one allreduce request per gradient costs ~20 us of Python per gradient per step (a Request, a
handle, a finalize, a copy out of the fusion buffer), which on a model of many small tensors is more
than the reduction itself and, on a busy host, is CPU taken from training (issue 27: 100 x
Linear(64, 64) spent 5 ms of CPU per step per rank in it against 7 ms of compute). A bucket is one
grouped allreduce (flat.py: one copy in, one request, one copy out), started by the hook of its last
member, as torch DDP's reducer does.

Contract of `plan`: a pure function of the parameters' order, dtypes, devices and sizes, so every rank
of a job with the same model makes the same buckets (that is what lets a bucket be one named
operation). Parameters taken: CPU and strided (dense), requiring grad; in reverse registration order
(the order backward finishes them), one dtype per bucket, a bucket closed once it holds `cap` bytes (a
parameter larger than `cap` is a bucket of its own); with `first` > 0 the first bucket of each dtype
closes at `first` bytes already (torch DDP's 1 MiB first bucket): the gradients backward finishes first
start their reduction while the rest of backward still runs. The others (CUDA, sparse layouts) are left
to the optimizer's per-gradient path. `cap` <= 0: no buckets (Horovod's per-gradient allreduces).

FIRST_BYTES, the optimizer's `first`, is 0 (no smaller first bucket): measured on 2 ranks sharing 2 cores
(issue 40, docs/benchmarks/ceiling.md), a 1 MiB first bucket made the 1.7 MB model's step cost ~1.3 ms
more CPU per rank (a second bucket's round, and the engine's thread woken to reduce it while backward
runs on the same core): overlap needs a core to overlap on. Buckets after the first start during
backward either way (a model of more than `cap` bytes: ResNet-18's 45 MB are two).
The cap comes from the runtime's settings (runtime/horovod_env.py: TRAINRUN_BUCKET_BYTES, 25 MiB).
"""
from __future__ import annotations

import torch


FIRST_BYTES = 0  # the first bucket's cap (0: none; DDP's is 1 << 20); never above `cap`


def plan(params, cap: int, first: int = FIRST_BYTES) -> list[tuple]:
    """Buckets (tuples of parameters, each in backward order) for `params` in registration order."""
    if cap <= 0:
        return []
    first = min(first, cap) if first > 0 else cap
    done: list[tuple] = []
    open_: dict = {}  # dtype -> (members, bytes)
    closed: set = set()  # dtypes whose first bucket is done
    for p in reversed(list(params)):
        if not p.requires_grad or p.device.type != "cpu" or p.layout is not torch.strided:
            continue
        members, size = open_.get(p.dtype, ([], 0))
        members.append(p)
        size += p.numel() * p.element_size()
        if size >= (cap if p.dtype in closed else first):
            done.append(tuple(members))
            closed.add(p.dtype)
            open_.pop(p.dtype, None)
        else:
            open_[p.dtype] = (members, size)
    done.extend(tuple(members) for members, _ in open_.values())
    return done
