"""Horovod 0.28.1's examples/ray/pytorch_ray_elastic.py in shape, run unchanged: an elastic torch loop
(hvd.elastic.TorchState, @hvd.elastic.run, state.commit(), a reset callback that scales the learning rate)
driven through RayExecutor(settings, min_workers=..., max_workers=...) -- Horovod 0.28.1's elastic API (the
example still names the deprecated ElasticRayExecutor). A small MLP on synthetic MNIST-shaped data.

--fail-once: on the first attempt rank 1 dies (os._exit) after a few commits, so the job must go on from the
last commit with a new world. train_fn returns what the test checks."""
import argparse
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

import horovod.torch as hvd
from horovod.ray import ray_logger

parser = argparse.ArgumentParser(description='PyTorch elastic Ray example')
parser.add_argument('--address', type=str, default=None, help="Ray cluster address")
parser.add_argument('--batch-size', type=int, default=16)
parser.add_argument('--epochs', type=int, default=2)
parser.add_argument('--batches-per-epoch', type=int, default=6)
parser.add_argument('--lr', type=float, default=0.01)
parser.add_argument('--min-workers', type=int, default=2)
parser.add_argument('--max-workers', type=int, default=2)
parser.add_argument('--num-batches-per-commit', type=int, default=1)
parser.add_argument('--fail-once', action='store_true', default=False)
args = parser.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x.view(-1, 28 * 28)))), dim=1)


def train_fn():
    # Horovod: initialize library.
    hvd.init()
    torch.manual_seed(42)
    # Horovod: limit # of CPU threads to be used per worker.
    torch.set_num_threads(1)
    attempt = int(os.environ.get("TRAINRUN_RESTART_COUNT", "0"))

    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    # adjust learning rate on reset
    def on_state_reset():
        for param_group in optimizer.param_groups:
            param_group['lr'] = args.lr * hvd.size()

    state = hvd.elastic.TorchState(model, optimizer, epoch=1, batch=0, steps=0)
    state.register_reset_callbacks([on_state_reset])

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, args.epochs + 1):
            state.model.train()
            for state.batch in range(state.batch, args.batches_per_epoch):
                g = torch.Generator().manual_seed(state.epoch * 1000 + state.batch * 10 + hvd.rank())
                data = torch.rand(args.batch_size, 1, 28, 28, generator=g)
                target = torch.randint(0, 10, (args.batch_size,), generator=g)
                state.optimizer.zero_grad()
                loss = F.nll_loss(state.model(data), target)
                loss.backward()
                state.optimizer.step()
                state.steps += 1
                if (state.batch + 1) % args.num_batches_per_commit == 0:
                    state.commit()
                if args.fail_once and attempt == 0 and hvd.rank() == 1 and state.steps == 3:
                    os._exit(1)  # a worker lost mid-epoch
            state.batch = 0
            if hvd.rank() == 0:  # to the driver's callbacks, as Horovod's basic_ray_elastic.py does
                ray_logger.log({"epoch": state.epoch, "size": hvd.size(), "steps": state.steps})

    train(state)
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    return {"rank": hvd.rank(), "size": hvd.size(), "attempt": attempt, "epoch": state.epoch,
            "steps": state.steps, "checksum": checksum}


if __name__ == '__main__':
    import ray
    from horovod.ray import RayExecutor

    ray.init(address=args.address)
    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, min_workers=args.min_workers, max_workers=args.max_workers,
                           use_gpu=False, cpus_per_worker=1)
    executor.start()
    logged = []
    results = executor.run(train_fn, callbacks=[logged.append])
    executor.shutdown()
    print("RESULTS", json.dumps(results))
    print("STEP", json.dumps(["logged", logged]))
