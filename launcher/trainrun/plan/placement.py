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
from trainrun.plan.coords import RankCoords
from trainrun.plan.hosts import HostSpec
from trainrun.plan.limits import max_ranks


@dataclass(frozen=True)
class RankAssignment(RankCoords):
    """A rank's coordinates plus where it runs: its host (node_rank of nnodes) and its GPUs there."""

    node_rank: int
    nnodes: int
    host: HostSpec
    gpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank {self.node_rank} out of range for nnodes {self.nnodes}")


def ranks_per_host(hosts: list[HostSpec], np: int, oversubscribe: bool = False) -> list[int]:
    """How many ranks each host gets (same order as `hosts`; zeros for unused hosts)."""
    if np < 1:
        raise UsageError(f"-np {np}: must be at least 1")
    if np > (cap := max_ranks()):
        raise UsageError(f"-np {np}: a job may have at most {cap} ranks; lower -np or the hosts' slots "
                         "(or raise the cap with TRAINRUN_MAX_RANKS)")
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
    rounds, extra = divmod(left, len(hosts))  # the rest round robin, one per host: whole rounds at once
    return [c + rounds + (i < extra) for i, c in enumerate(counts)]


def cross_coords(counts: list[int], node_rank: int, local_rank: int) -> tuple[int, int]:
    """(cross_rank, cross_size) of local rank `local_rank` on node `node_rank`, given every node's rank count."""
    holders = [n for n, c in enumerate(counts) if c > local_rank]
    return holders.index(node_rank), len(holders)


def cross_sizes(counts: list[int]) -> list[int]:
    """cross_size of every local rank: how many nodes have more than `l` ranks, for l in range(max(counts)).
    Linear in the ranks (a count of counts, summed from the top), where cross_coords per rank is not."""
    have = [0] * (max(counts, default=0) + 1)
    for c in counts:
        have[c] += 1
    sizes, above = [], 0
    for c in range(len(have) - 1, 0, -1):
        above += have[c]
        sizes.append(above)
    return sizes[::-1]


def gpus_for(local_rank: int, local_size: int, pool: tuple[int, ...], per_proc: int, allow_sharing: bool, host: str,
             isolate: bool = True) -> tuple[int, ...]:
    """The GPU indices given to one local rank from its host's pool (empty pool: none), round robin when
    there are fewer than the local ranks need. That is an error only for `isolate` (--gpus-per-proc:
    GPUs were asked for) without `allow_sharing`: a job that does not ask for GPUs (a CPU job on a GPU
    host) still runs, its ranks sharing the GPUs they are named."""
    if not pool:
        return ()
    need = local_size * per_proc
    if need > len(pool) and isolate and not allow_sharing:
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
    isolate_gpus: bool = True,
) -> list[RankAssignment]:
    """Place `np` ranks on `hosts`. Hosts that get no rank are not part of the job. `isolate_gpus`: the
    job asked for GPUs (--gpus-per-proc), so too few of them is an error without `allow_gpu_sharing`."""
    counts = ranks_per_host(hosts, np, oversubscribe)
    used = [(h, c) for h, c in zip(hosts, counts) if c]
    gpu_pools = gpu_pools or {}
    sizes = cross_sizes([c for _, c in used])
    seen = [0] * len(sizes)  # nodes so far that hold local rank l: the next one's cross rank
    out, rank = [], 0
    for node_rank, (host, count) in enumerate(used):
        pool = gpu_pools.get(host.name, ())
        for local_rank in range(count):
            cross_rank, cross_size = seen[local_rank], sizes[local_rank]
            seen[local_rank] += 1
            out.append(
                RankAssignment(
                    rank=rank,
                    size=np,
                    host=host,
                    local_rank=local_rank,
                    local_size=count,
                    cross_rank=cross_rank,
                    cross_size=cross_size,
                    node_rank=node_rank,
                    nnodes=len(used),
                    gpus=gpus_for(local_rank, count, pool, gpus_per_proc, allow_gpu_sharing, host.name,
                                  isolate_gpus),
                )
            )
            rank += 1
    return out


def shares_gpus(assignments: list[RankAssignment]) -> bool:
    """Whether two ranks of one host were given the same GPU."""
    seen = set()
    for a in assignments:
        for g in a.gpus:
            if (a.host.name, g) in seen:
                return True
            seen.add((a.host.name, g))
    return False
