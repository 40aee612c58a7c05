"""Horovod's examples/elastic/pytorch/pytorch_synthetic_benchmark_elastic.py in shape: hvd.elastic.TorchState,
@hvd.elastic.run, commits, a reset callback; a tiny model and a loss report."""
import argparse
import timeit

import numpy as np
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import horovod.torch as hvd
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401 (what elastic code imports)

from report import report

parser = argparse.ArgumentParser(description='PyTorch Synthetic Benchmark')
parser.add_argument('--batch-size', type=int, default=8)
parser.add_argument('--num-warmup-batches', type=int, default=2)
parser.add_argument('--num-batches-per-iter', type=int, default=3)
parser.add_argument('--num-iters', type=int, default=3)
parser.add_argument('--num-batches-per-commit', type=int, default=1)
parser.add_argument('--no-cuda', action='store_true', default=False)
args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

hvd.init()
torch.manual_seed(hvd.rank())
model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def lr_scaler():
    return hvd.size()


lr = 0.01
optimizer = optim.SGD(model.parameters(), lr=lr * lr_scaler())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=hvd.Compression.none, op=hvd.Average)
torch.manual_seed(100 + hvd.rank())
data = torch.randn(args.batch_size, 12)
target = torch.LongTensor(args.batch_size).random_() % 4
losses = []


def benchmark_step(state):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()
    losses.append(hvd.allreduce(loss.detach(), name="loss").item())
    state.batch += 1
    if state.batch == args.num_batches_per_commit:
        state.batch = 0
        state.commit()


def log(s):
    if hvd.rank() == 0:
        print(s)


@hvd.elastic.run
def run_benchmark(state):
    if not state.warm:
        log('Running warmup...')
        timeit.timeit(lambda: benchmark_step(state), number=args.num_warmup_batches)
        state.warm = True
        state.commit()
    if state.iter == 0:
        log('Running benchmark...')
    for x in range(state.iter, args.num_iters):
        time = timeit.timeit(lambda: benchmark_step(state), number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / time
        log('Iter #%d: %.1f img/sec per CPU' % (x, img_sec))
        state.img_secs.append(img_sec)
        state.iter = x
        state.commit()


def on_state_reset():
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr * lr_scaler()


state = hvd.elastic.TorchState(model, optimizer, img_secs=[], iter=0, batch=0, warm=False)
state.register_reset_callbacks([on_state_reset])
run_benchmark(state)
log('Img/sec per CPU: %.1f' % np.mean(state.img_secs))
report(hvd.rank(), losses, [p.detach().numpy() for p in model.parameters()], iters=len(state.img_secs))
