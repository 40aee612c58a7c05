"""Horovod's original TF1 pattern on trainrun (only the import differs from `horovod.tensorflow`):
a tf.compat.v1 graph, DistributedOptimizer around AdagradOptimizer, BroadcastGlobalVariablesHook,
MonitoredTrainingSession with StopAtStepHook, checkpoints on rank 0 only. Synthetic MNIST-shaped data.

    trainrun -np 2 python examples/tensorflow/tensorflow1_mnist.py --steps 200
"""
import argparse
import os
import sys

import numpy as np
import tensorflow as tf

import trainrun.tensorflow as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic import mnist_like, report  # noqa: E402


def model(x):
    w1 = tf.compat.v1.get_variable("w1", [784, 64], initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
    b1 = tf.compat.v1.get_variable("b1", [64], initializer=tf.compat.v1.zeros_initializer())
    w2 = tf.compat.v1.get_variable("w2", [64, 10], initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))
    b2 = tf.compat.v1.get_variable("b2", [10], initializer=tf.compat.v1.zeros_initializer())
    return tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2


class FinalWeights(tf.compat.v1.train.SessionRunHook):
    """Reads the trained variables when the session ends (for --report)."""

    def end(self, session):
        self.weights = session.run(tf.compat.v1.trainable_variables())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--checkpoint-dir", default="./checkpoints-tf1")
    parser.add_argument("--report", default="", help="write losses and a weight digest per rank to REPORT.rankN.json")
    args = parser.parse_args()

    tf.compat.v1.disable_eager_execution()
    hvd.init()
    images, labels = mnist_like(args.batch_size * 50, seed=hvd.rank())  # each rank its own shard
    images = images.reshape(-1, 784).astype(np.float32) / 255.0

    x = tf.compat.v1.placeholder(tf.float32, [None, 784])
    y = tf.compat.v1.placeholder(tf.int64, [None])
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=model(x)))
    global_step = tf.compat.v1.train.get_or_create_global_step()

    opt = tf.compat.v1.train.AdagradOptimizer(0.01 * hvd.size())  # scale the learning rate by the ranks
    opt = hvd.DistributedOptimizer(opt)
    train_op = opt.minimize(loss, global_step=global_step)

    final = FinalWeights()
    hooks = [hvd.BroadcastGlobalVariablesHook(0), tf.compat.v1.train.StopAtStepHook(last_step=args.steps), final]
    config = tf.compat.v1.ConfigProto()
    config.gpu_options.allow_growth = True
    config.gpu_options.visible_device_list = str(hvd.local_rank())
    checkpoint_dir = args.checkpoint_dir if hvd.rank() == 0 else None  # only rank 0 saves

    losses, step = [], 0
    with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir, config=config,
                                                     hooks=hooks, save_summaries_steps=None) as sess:
        while not sess.should_stop():
            i = step % 50 * args.batch_size
            _, value = sess.run([train_op, loss], feed_dict={x: images[i:i + args.batch_size],
                                                             y: labels[i:i + args.batch_size]})
            losses.append(value)
            step += 1
    if hvd.rank() == 0:
        print(f"steps {step}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    if args.report:
        report(args.report, hvd.rank(), losses, final.weights)


if __name__ == "__main__":
    main()
