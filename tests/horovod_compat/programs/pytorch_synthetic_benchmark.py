"""Horovod's examples/pytorch/pytorch_synthetic_benchmark.py in shape (imports, calls, flow), with a tiny model
built in torch (torchvision's models need no GPU, but its CPU wheel does not load here) and a loss report."""
import argparse
import timeit

import numpy as np
import torch.backends.cudnn as cudnn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import horovod.torch as hvd

from report import report

parser = argparse.ArgumentParser(description='PyTorch Synthetic Benchmark',
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--fp16-allreduce', action='store_true', default=False)
parser.add_argument('--batch-size', type=int, default=8)
parser.add_argument('--num-warmup-batches', type=int, default=2)
parser.add_argument('--num-batches-per-iter', type=int, default=3)
parser.add_argument('--num-iters', type=int, default=3)
parser.add_argument('--no-cuda', action='store_true', default=False)
parser.add_argument('--use-adasum', action='store_true', default=False)
args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

hvd.init()
torch.manual_seed(hvd.rank())  # different initial weights: broadcast_parameters must make them equal

if args.cuda:
    torch.cuda.set_device(hvd.local_rank())

cudnn.benchmark = True


def tiny_model(norm_layer):
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), norm_layer(8), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))


model = tiny_model(norm_layer=hvd.SyncBatchNorm)
lr_scaler = hvd.size() if not args.use_adasum else 1
if args.cuda:
    model.cuda()
    if args.use_adasum and hvd.nccl_built():
        lr_scaler = hvd.local_size()

optimizer = optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer,
                                     named_parameters=model.named_parameters(),
                                     compression=compression,
                                     op=hvd.Adasum if args.use_adasum else hvd.Average)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

torch.manual_seed(100 + hvd.rank())
data = torch.randn(args.batch_size, 3, 16, 16)
target = torch.LongTensor(args.batch_size).random_() % 10
if args.cuda:
    data, target = data.cuda(), target.cuda()
losses = []


def benchmark_step():
    optimizer.zero_grad()
    output = model(data)
    loss = F.cross_entropy(output, target)
    loss.backward()
    optimizer.step()
    losses.append(hvd.allreduce(loss.detach(), name="loss").item())


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end='\n' if nl else '')


log('Batch size: %d' % args.batch_size)
device = 'GPU' if args.cuda else 'CPU'
log('Number of %ss: %d' % (device, hvd.size()))
log('Running warmup...')
timeit.timeit(benchmark_step, number=args.num_warmup_batches)
log('Running benchmark...')
img_secs = []
for x in range(args.num_iters):
    time = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / time
    log('Iter #%d: %.1f img/sec per %s' % (x, img_sec, device))
    img_secs.append(img_sec)
img_sec_mean = np.mean(img_secs)
log('Total img/sec on %d %s(s): %.1f' % (hvd.size(), device, hvd.size() * img_sec_mean))

import trainrun.torch  # the test's own check: the names are trainrun's objects
report(hvd.rank(), losses, [p.detach().numpy() for p in model.parameters()],
       same_objects=hvd.allreduce is trainrun.torch.allreduce and hvd.DistributedOptimizer is trainrun.torch.DistributedOptimizer)
