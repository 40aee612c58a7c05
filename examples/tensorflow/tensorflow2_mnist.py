"""Horovod's TF2 custom training loop on trainrun (only the import differs from `horovod.tensorflow`):
DistributedGradientTape inside @tf.function, and after the first step the broadcast of the model's
and the optimizer's variables from rank 0. Synthetic MNIST-shaped data.

    trainrun -np 2 python examples/tensorflow/tensorflow2_mnist.py --steps 100
"""
import argparse
import os
import sys

import tensorflow as tf

import trainrun.tensorflow as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic import mnist_like, report  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--report", default="", help="write losses and a weight digest per rank to REPORT.rankN.json")
    args = parser.parse_args()

    hvd.init()
    gpus = tf.config.experimental.list_physical_devices("GPU")
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    images, labels = mnist_like(4096, seed=hvd.rank())
    dataset = tf.data.Dataset.from_tensor_slices((tf.cast(images[..., tf.newaxis] / 255.0, tf.float32),
                                                  tf.cast(labels, tf.int64)))
    dataset = dataset.repeat().shuffle(1000, seed=hvd.rank()).batch(args.batch_size)

    model = tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(8, [3, 3], activation="relu"), tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Flatten(), tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10, activation="softmax")])
    loss = tf.losses.SparseCategoricalCrossentropy()
    opt = tf.optimizers.Adam(0.001 * hvd.size())

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            probs = model(images, training=True)
            loss_value = loss(labels, probs)
        tape = hvd.DistributedGradientTape(tape)  # the gradients come back averaged over the ranks
        grads = tape.gradient(loss_value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        # Every rank starts from rank 0's state: broadcast after the first step, once the optimizer
        # has made its variables (Keras 3: opt.variables is a list; tf-keras: call opt.variables())
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables() if callable(opt.variables) else opt.variables, root_rank=0)
        return loss_value

    losses = []
    for batch, (x, y) in enumerate(dataset.take(args.steps)):
        losses.append(float(training_step(x, y, batch == 0)))
        if batch % 20 == 0 and hvd.rank() == 0:
            print(f"step {batch}: loss {losses[-1]:.4f}")
    if args.report:
        report(args.report, hvd.rank(), losses, model.get_weights())


if __name__ == "__main__":
    main()
