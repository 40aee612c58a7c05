"""Placement: hosts + number of processes -> one RankAssignment per rank. Pure.

Ranks fill hosts in the order given, up to each host's slots (so `-np 3 -H a:2,b:2` puts ranks 0,1 on a
and rank 2 on b); with oversubscription the extra ranks go round-robin, one per host. Ranks on a host
are always consecutive (block placement), which MPI's process mapping and local ranks rely on.

cross rank = index of this rank among the ranks with the same local rank (Horovod's definition); for
local rank 0 it equals the node rank.
"""
from __future__ import annotations

from dataclasses import dataclass

from trainrun.errors import UsageError
from trainrun.hosts import HostSpec


@dataclass(frozen=True)
class RankAssignment:
    rank: int
    size: int
    host: HostSpec
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    node_rank: int
    nnodes: int
    gpus: tuple[int, ...] = ()

    def __post_init__(self):
        if not (0 <= self.rank < self.size and 0 <= self.local_rank < self.local_size):
            raise ValueError(f"inconsistent assignment {self}")
        if not (0 <= self.cross_rank < self.cross_size and 0 <= self.node_rank < self.nnodes):
            raise ValueError(f"inconsistent assignment {self}")


def ranks_per_host(hosts: list[HostSpec], np: int, oversubscribe: bool = False) -> list[int]:
    """How many ranks each host gets (same order as `hosts`; zeros for unused hosts)."""
    if np < 1:
        raise UsageError(f"-np {np}: must be at least 1")
    total = sum(h.slots for h in hosts)
    if np > total and not oversubscribe:
        raise UsageError(
            f"-np {np} is more than the {total} slot(s) of the hosts given; "
            "lower -np, add hosts or slots, or pass --oversubscribe"
        )
    counts, left = [], np
    for h in hosts:
        take = min(h.slots, left)
        counts.append(take)
        left -= take
    i = 0
    while left:
        counts[i % len(hosts)] += 1
        left -= 1
        i += 1
    return counts


def gpus_for(local_rank: int, local_size: int, pool: tuple[int, ...], per_proc: int, allow_sharing: bool, host: str) -> tuple[int, ...]:
    """The GPU indices given to one local rank from its host's pool (empty pool: none)."""
    if not pool:
        return ()
    need = local_size * per_proc
    if need > len(pool) and not allow_sharing:
        raise UsageError(
            f"host {host}: {local_size} local rank(s) x {per_proc} GPU(s) need {need} GPUs but it has {len(pool)}; "
            "lower -np or --gpus-per-proc, or pass --allow-gpu-sharing"
        )
    start = local_rank * per_proc
    return tuple(pool[(start + k) % len(pool)] for k in range(per_proc))


def assign_ranks(
    hosts: list[HostSpec],
    np: int,
    *,
    oversubscribe: bool = False,
    gpu_pools: dict[str, tuple[int, ...]] | None = None,
    gpus_per_proc: int = 1,
    allow_gpu_sharing: bool = False,
) -> list[RankAssignment]:
    """Place `np` ranks on `hosts`. Hosts that get no rank are not part of the job."""
    counts = ranks_per_host(hosts, np, oversubscribe)
    used = [(h, c) for h, c in zip(hosts, counts) if c]
    gpu_pools = gpu_pools or {}
    out, rank = [], 0
    for node_rank, (host, count) in enumerate(used):
        pool = gpu_pools.get(host.name, ())
        for local_rank in range(count):
            holders = [n for n, (_, c) in enumerate(used) if c > local_rank]
            out.append(
                RankAssignment(
                    rank=rank,
                    size=np,
                    host=host,
                    local_rank=local_rank,
                    local_size=count,
                    cross_rank=holders.index(node_rank),
                    cross_size=len(holders),
                    node_rank=node_rank,
                    nnodes=len(used),
                    gpus=gpus_for(local_rank, count, pool, gpus_per_proc, allow_gpu_sharing, host.name),
                )
            )
            rank += 1
    return out
