"""Elastic PyTorch training on trainrun: the job survives a failed rank or host and follows the hosts.

    trainrun -np 4 --max-restarts 3 python examples/elastic_torch.py              # restart after a failure
    trainrun --hostfile hosts.txt --min-np 2 --max-np 8 python examples/elastic_torch.py   # as many as fit

Horovod's elastic API (`hvd.elastic`): the model, the optimizer and the progress live in a TorchState, and
`state.commit()` every few steps leaves a copy with this host's trainrun agent. When a rank or a host fails,
trainrun stops every rank and starts the job again on the hosts left (new processes, maybe a new number
of them); `@hvd.elastic.run` then gives every rank the newest committed state, calls the reset callbacks,
and training goes on from the last commit: at most `--commit-every` steps are done again.

What depends on the number of ranks is worked out inside train(), which runs again after every reset:
each step takes the next size x batch-size samples of the epoch's order (this rank its share), so a new
size neither repeats nor skips samples; the learning rate, one rank's rate times the size, is set again
by the reset callback (the committed optimizer state holds the old size's rate).
"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import trainrun.torch as hvd


def make_data(n, seed=0):
    """One fixed synthetic data set, all of it on every rank (each step takes its share): 10 classes given
    by a linear rule."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g)
    y = (x @ torch.randn(32, 10, generator=g)).argmax(1)
    return x, y


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.02, help="the learning rate of one rank")
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--commit-every", type=int, default=20, help="steps between commits")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    x, y = make_data(args.samples)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    def scale_lr():
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    # epoch and sample (where in the epoch's order the next step starts) are committed with the model
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, sample=0)
    state.register_reset_callbacks([scale_lr])   # after a restart: the committed optimizer has the old size's rate

    @hvd.elastic.run                  # every attempt: load the newest committed state on every rank, then train
    def train(state):
        if hvd.rank() == 0:
            print(f"attempt {hvd.elastic.restart_count()}: {hvd.size()} ranks, lr {optimizer.param_groups[0]['lr']:g}, "
                  f"from epoch {state.epoch} sample {state.sample}", flush=True)
        per_step = hvd.size() * args.batch_size
        steps = 0
        while state.epoch < args.epochs:
            order = torch.randperm(len(x), generator=torch.Generator().manual_seed(state.epoch))  # same on every rank
            while state.sample + per_step <= len(x):
                mine = order[state.sample + hvd.rank() * args.batch_size:][:args.batch_size]
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x[mine]), y[mine])
                loss.backward()
                optimizer.step()
                state.sample += per_step
                steps += 1
                if steps % args.commit_every == 0:
                    state.commit()    # a copy goes to this host's agent; the launcher may ask for a reset here
                    mean = hvd.allreduce(loss.detach(), name="loss").item()  # this step's, averaged over the ranks
                    if hvd.rank() == 0:
                        print(f"epoch {state.epoch} sample {state.sample}: loss {mean:.4f} (committed)", flush=True)
            state.epoch, state.sample = state.epoch + 1, 0
            state.commit()

    train(state)
    if hvd.rank() == 0:
        print(f"done: {args.epochs} epochs", flush=True)


if __name__ == "__main__":
    main()
