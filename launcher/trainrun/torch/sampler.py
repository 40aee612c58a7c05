"""`hvd.elastic.ElasticSampler`: Horovod 0.28.1's sampler that re-partitions an epoch's unprocessed samples
when the world changes size.

An epoch has one order of the dataset's indices (shuffled by `seed + epoch`, the same on every rank) and a
count of how many of its first indices the job has processed (`processed_num`). Each rank takes every
`size()`-th index of the rest, starting at its `rank()` (padded, like torch's DistributedSampler, so every rank
gets as many). After `record_batch(batch_idx, batch_size)` on every rank, the samples taken so far are exactly
the first `processed_num` of the order, whatever the size was when they were taken: so a restart at another
size (the sampler's state committed and synced by `hvd.elastic.TorchState(..., sampler=sampler)`) shares out
the rest of the epoch among the new ranks and takes no sample twice.

    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=b, sampler=sampler)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)
    ...
        for batch_idx, batch in enumerate(loader):
            ...
            sampler.record_batch(batch_idx, b)
            state.commit()
        state.epoch += 1
        sampler.set_epoch(state.epoch)      # at the END of the epoch: clears processed_num
"""
from __future__ import annotations

import math
import random

import torch.utils.data

from trainrun.runtime.lifecycle import rank, size

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler):
    """Partitions `dataset` across the ranks, skipping what this epoch already processed (Horovod 0.28.1's
    ElasticSampler: `set_epoch`, `record_batch`, `state_dict`/`load_state_dict`, `reset`). `shuffle`: a new
    order each epoch, from `seed + epoch` (`seed` must be the same on every rank). Needs `hvd.init()` first."""

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0          # how many of the epoch's order the whole job has processed
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0            # this rank's share of the rest (padded)
        self.total_size = 0
        self.indices: list[int] = []    # this rank's indices of the last iteration
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch`: its own order (when shuffling) and nothing processed. Call it at the end of an
        epoch, not the start, so that a restart in the middle of one does not process its samples again."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Count one batch of `batch_size` samples as processed on every rank (call it on every rank, after
        the step): the job has then processed `batch_size * size()` more of the epoch's order."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict) -> None:
        """Take a state (a commit's, another rank's) and share the rest of its epoch among the ranks now."""
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        """Share out the epoch's unprocessed indices by the current rank() and size()."""
        self.num_replicas = size()
        self.rank = rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)  # the same order on every rank
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = self.remaining_indices[:]
        pad = self.total_size - len(indices)
        while pad > 0:  # as DistributedSampler: repeat from the start so that every rank gets num_samples
            indices += indices[:pad]
            pad = self.total_size - len(indices)
        self.indices = indices[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
