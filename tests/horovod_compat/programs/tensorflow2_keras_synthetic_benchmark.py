"""Horovod's examples/tensorflow2/tensorflow2_keras_synthetic_benchmark.py in shape: horovod.tensorflow.keras's
DistributedOptimizer, the broadcast and metric-average callbacks, model.fit on a tf.data set; a tiny model and a
loss report. (Keras 3's compile() has no experimental_run_tf_function, which Horovod's example passes.)"""
import argparse
import os
from timeit import default_timer as timer

import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd

from report import report

parser = argparse.ArgumentParser(description='TensorFlow Synthetic Benchmark')
parser.add_argument('--fp16-allreduce', action='store_true', default=False)
parser.add_argument('--batch-size', type=int, default=8)
parser.add_argument('--num-batches-per-iter', type=int, default=3)
parser.add_argument('--num-iters', type=int, default=3)
parser.add_argument('--no-cuda', action='store_true', default=False)
args = parser.parse_args()
args.cuda = not args.no_cuda
device = 'GPU' if args.cuda else 'CPU'

hvd.init()
if hvd.rank() == 0:
    print('Number of %ss: %d' % (device, hvd.size()))

if args.cuda:
    device_name = 'XPU' if hvd.sycl_built() else 'GPU'
    gpus = tf.config.experimental.list_physical_devices(device_name)
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], device_name)
else:
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

tf.random.set_seed(hvd.rank())
model = tf.keras.Sequential([tf.keras.Input((12, 12, 3)), tf.keras.layers.Conv2D(4, 3, activation="relu"),
                             tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(10, activation="softmax")])
opt = tf.optimizers.SGD(0.01)
data = tf.random.uniform([args.batch_size, 12, 12, 3])
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=9, dtype=tf.int64)
dataset = tf.data.Dataset.from_tensor_slices((data, target)).cache().repeat().batch(args.batch_size)

compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
opt = hvd.DistributedOptimizer(opt, compression=compression)
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt)

callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
]


class TimingCallback(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.starttime = timer()

    def on_epoch_end(self, epoch, logs=None):
        img_sec = args.batch_size * args.num_batches_per_iter / (timer() - self.starttime)
        print('Iter #%d: %.1f img/sec per %s' % (epoch, img_sec, device))


if hvd.rank() == 0:
    callbacks.append(TimingCallback())

history = model.fit(dataset, batch_size=args.batch_size, steps_per_epoch=args.num_batches_per_iter,
                    callbacks=callbacks, epochs=args.num_iters, verbose=0)
report(hvd.rank(), history.history["loss"], [np.asarray(v) for v in model.variables])
