"""A Horovod-style PyTorch training script on trainrun (only the import differs from Horovod's).

    trainrun -np 2 python examples/train_torch.py        (or: mpiexec -n 2 python examples/train_torch.py)

Synthetic data (10 classes given by a linear rule on the pooled image), a small CNN, a few epochs:
finishes in seconds on CPU.
The pattern: init; pin one GPU per local rank; shard the data by rank; scale the learning rate by the
number of ranks, warming up to it over the first epoch; wrap the optimizer; broadcast the initial state
from rank 0; print and checkpoint only on rank 0.

Learning rate: N ranks step with N times the batch, so the rate is N times the one-rank rate (`--lr`),
reached by a linear warm-up over `--warmup-epochs` (Goyal et al., "Accurate, Large Minibatch SGD", as
Horovod advises): the full rate from the first step makes the early, large updates diverge. The rule holds
only while N x lr stays where the model trains at all: with momentum 0.9 this one diverges above about
0.2, so the default 0.01 serves up to 16 ranks; for more ranks, lower `--lr`.
"""
import argparse
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import trainrun.torch as hvd


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def synthetic_shard(n, rank, size, seed=0):
    """This rank's share of one fixed data set: every rank sees different samples."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 16, 16, generator=g)
    rule = torch.randn(16, 10, generator=g)  # the class depends on the 4x4-pooled image
    y = (F.avg_pool2d(x, 4).flatten(1) @ rule).argmax(1)
    return x[rank::size], y[rank::size]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01, help="the learning rate of one rank")
    parser.add_argument("--warmup-epochs", type=float, default=1.0)
    parser.add_argument("--samples", type=int, default=4096, help="the whole data set, shared by all ranks")
    parser.add_argument("--checkpoint", default="checkpoint.pt")
    parser.add_argument("--fp16-allreduce", action="store_true")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(42)
    device = torch.device("cpu")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    # one GPU per local rank (what NCCL needs); ranks may share GPUs with --allow-gpu-sharing (their
    # collectives then go through host memory); with fewer GPUs and no such flag, train on the CPU
    if gpus >= hvd.local_size() or (gpus and os.environ.get("TRAINRUN_GPU_OPERATIONS") == "mpi"):
        device = torch.device("cuda", hvd.local_rank() % gpus)
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))

    if hvd.rank() == 0:
        print(f"{hvd.size()} ranks, training on {device.type}" + (f" ({gpus} GPU(s) on this host)" if gpus else ""))
    x, y = synthetic_shard(args.samples, hvd.rank(), hvd.size())
    x, y = x.to(device), y.to(device)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    steps_per_epoch = math.ceil(len(x) / args.batch_size)
    warmup_steps = args.warmup_epochs * steps_per_epoch

    def lr_at(step):
        """From the one-rank rate up to size x it, linearly over the warm-up; then size x it."""
        progress = min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0
        return args.lr * (1 + (hvd.size() - 1) * progress)

    step = 0
    for epoch in range(args.epochs):
        model.train()
        total, batches = torch.zeros((), device=device), 0
        for i in range(0, len(x), args.batch_size):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            step += 1
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x[i:i + args.batch_size]), y[i:i + args.batch_size])
            loss.backward()
            optimizer.step()
            total += loss.detach()
            batches += 1
        epoch_loss = hvd.allreduce(total / batches, name="epoch_loss").item()  # averaged over ranks
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {epoch_loss:.4f}", flush=True)

    if hvd.rank() == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, args.checkpoint)
        print(f"saved {args.checkpoint}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
