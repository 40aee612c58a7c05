"""Horovod's TF2 Keras pattern on trainrun (only the import differs from `horovod.tensorflow.keras`):
GPU pinning by local rank, a tf.data pipeline, a Conv2D/MaxPool/Dropout/Dense CNN, DistributedOptimizer
around Adam with the learning rate scaled by the ranks, Horovod's callbacks, checkpoints on rank 0.
Synthetic MNIST-shaped data. Keras 3 by default; tf-keras (Keras 2) with TF_USE_LEGACY_KERAS=1.

    trainrun -np 2 python examples/tensorflow/tensorflow2_keras_mnist.py --epochs 3
"""
import argparse
import os
import sys

import tensorflow as tf

import trainrun.tensorflow.keras as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic import mnist_like, report  # noqa: E402


def cnn(filters=(8, 16), dense=32, dropout=(0.25, 0.5)):
    """Horovod's MNIST CNN (its widths are 32, 64, 128: pass them for the original)."""
    return tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(filters[0], [3, 3], activation="relu"),
        tf.keras.layers.Conv2D(filters[1], [3, 3], activation="relu"),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(dropout[0]),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(dense, activation="relu"),
        tf.keras.layers.Dropout(dropout[1]),
        tf.keras.layers.Dense(10, activation="softmax")])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=500, help="steps per epoch over all ranks (Horovod's 500)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--checkpoint-dir", default="./checkpoints-tf2-keras")
    parser.add_argument("--report", default="", help="write losses and a weight digest per rank to REPORT.rankN.json")
    args = parser.parse_args()

    hvd.init()
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    images, labels = mnist_like(4096, seed=hvd.rank())
    dataset = tf.data.Dataset.from_tensor_slices((tf.cast(images[..., tf.newaxis] / 255.0, tf.float32),
                                                  tf.cast(labels, tf.int64)))
    dataset = dataset.repeat().shuffle(1000, seed=hvd.rank()).batch(args.batch_size)

    model = cnn()
    scaled_lr = 0.001 * hvd.size()
    opt = hvd.DistributedOptimizer(tf.optimizers.Adam(scaled_lr))
    model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"])

    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # every rank starts from rank 0's weights
                 hvd.callbacks.MetricAverageCallback(),
                 hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=min(3, args.epochs),
                                                          verbose=1)]
    if hvd.rank() == 0:  # only rank 0 saves checkpoints
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        suffix = "h5" if os.environ.get("TF_USE_LEGACY_KERAS") == "1" else "keras"
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(os.path.join(args.checkpoint_dir,
                                                                         "checkpoint-{epoch}." + suffix)))
    history = model.fit(dataset, steps_per_epoch=args.steps // hvd.size(), callbacks=callbacks, epochs=args.epochs,
                        verbose=1 if hvd.rank() == 0 else 0)
    if args.report:
        report(args.report, hvd.rank(), history.history["loss"], model.get_weights())


if __name__ == "__main__":
    main()
