"""Horovod's elastic torch loop over a DataLoader with hvd.elastic.ElasticSampler, committing after each batch.

The state: the sampler, the epoch, and `seen` (how many times the job processed each sample this epoch, summed
over the ranks by an allreduce at each step): all committed, so a restart rolls all three back together.
Environment: N (dataset size), BATCH, EPOCHS, STEP_PAUSE (seconds per step, so a test can act mid-epoch).
Every rank prints `take epoch E batch B size N restart R idx i,j,...` for each batch it processes; rank 0 prints
`resume epoch E batch B processed P size N` after a restart's sync, and `epoch E done size N seen min..max`.
"""
import os
import time

import torch

import horovod.torch as hvd

N = int(os.environ.get("N", "48"))
BATCH = int(os.environ.get("BATCH", "2"))
EPOCHS = int(os.environ.get("EPOCHS", "2"))
PAUSE = float(os.environ.get("STEP_PAUSE", "0.05"))

hvd.init()
dataset = torch.utils.data.TensorDataset(torch.arange(N))
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
state = hvd.elastic.TorchState(sampler=sampler, epoch=0, batch=0, seen=torch.zeros(N, dtype=torch.int64))


def on_reset():
    if hvd.rank() == 0:
        print(f"resume epoch {state.epoch} batch {state.batch} processed {sampler.processed_num} size {hvd.size()}",
              flush=True)


state.register_reset_callbacks([on_reset])


@hvd.elastic.run
def train(state):
    restart = hvd.elastic.restart_count()
    while state.epoch < EPOCHS:
        for batch_idx, (idx,) in enumerate(loader):
            print(f"take epoch {state.epoch} batch {state.batch} size {hvd.size()} restart {restart} "
                  f"idx {','.join(map(str, idx.tolist()))}", flush=True)
            mine = torch.zeros(N, dtype=torch.int64)
            mine.index_add_(0, idx, torch.ones_like(idx))
            state.seen += hvd.allreduce(mine, op=hvd.Sum, name="seen")
            sampler.record_batch(batch_idx, BATCH)
            state.batch += 1
            state.commit()
            time.sleep(PAUSE)
        if hvd.rank() == 0:
            print(f"epoch {state.epoch} done size {hvd.size()} seen {int(state.seen.min())}..{int(state.seen.max())}",
                  flush=True)
        state.epoch, state.batch = state.epoch + 1, 0
        state.seen.zero_()
        sampler.set_epoch(state.epoch)
        state.commit()


train(state)
print(f"final epoch {state.epoch}", flush=True)
