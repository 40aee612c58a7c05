"""Horovod's examples/tensorflow2/tensorflow2_synthetic_benchmark.py in shape: DistributedGradientTape inside a
tf.function, variables broadcast after the first step; a tiny model and a loss report. (`opt.variables` is a
property in Keras 3, where Horovod's example, written for Keras 2, calls it.)"""
import argparse
import os
import timeit

import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd

from report import report

parser = argparse.ArgumentParser(description='TensorFlow Synthetic Benchmark')
parser.add_argument('--fp16-allreduce', action='store_true', default=False)
parser.add_argument('--batch-size', type=int, default=8)
parser.add_argument('--num-warmup-batches', type=int, default=2)
parser.add_argument('--num-batches-per-iter', type=int, default=3)
parser.add_argument('--num-iters', type=int, default=3)
parser.add_argument('--no-cuda', action='store_true', default=False)
args = parser.parse_args()
args.cuda = not args.no_cuda

hvd.init()

if args.cuda:
    gpus = tf.config.experimental.list_physical_devices('GPU')
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')
else:
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

tf.random.set_seed(hvd.rank())  # different initial weights: the broadcast must make them equal
model = tf.keras.Sequential([tf.keras.Input((12, 12, 3)), tf.keras.layers.Conv2D(4, 3, activation="relu"),
                             tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(10, activation="softmax")])
opt = tf.optimizers.SGD(0.01)
data = tf.random.uniform([args.batch_size, 12, 12, 3])
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=9, dtype=tf.int64)
losses = []


@tf.function
def benchmark_step(first_batch):
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    with tf.GradientTape() as tape:
        probs = model(data, training=True)
        loss = tf.reduce_mean(tf.losses.sparse_categorical_crossentropy(target, probs))
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)
    return hvd.allreduce(loss)


def step(first_batch):
    losses.append(float(benchmark_step(first_batch)))


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end='\n' if nl else '')


device = 'GPU' if args.cuda else 'CPU'
log('Number of %ss: %d' % (device, hvd.size()))
with tf.device(device):
    log('Running warmup...')
    step(first_batch=True)
    timeit.timeit(lambda: step(first_batch=False), number=args.num_warmup_batches)
    log('Running benchmark...')
    img_secs = []
    for x in range(args.num_iters):
        time = timeit.timeit(lambda: step(first_batch=False), number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / time
        log('Iter #%d: %.1f img/sec per %s' % (x, img_sec, device))
        img_secs.append(img_sec)
    log('Total img/sec on %d %s(s): %.1f' % (hvd.size(), device, hvd.size() * np.mean(img_secs)))

report(hvd.rank(), losses[1:], [v.numpy() for v in model.variables])  # the first loss is before the broadcast
