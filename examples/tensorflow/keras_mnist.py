"""Horovod's Keras pattern with NumPy arrays on trainrun (`import trainrun.keras as hvd` on Keras 3's
TensorFlow backend; only the import differs from `horovod.keras`): a LeNet, DistributedOptimizer,
Horovod's callbacks, `fit` on arrays with steps_per_epoch, a checkpoint saved by rank 0, then
`hvd.load_model` of that checkpoint (its optimizer wrapped again, state included) and more training.
Synthetic MNIST-shaped data.

    trainrun -np 2 python examples/tensorflow/keras_mnist.py --epochs 2
"""
import argparse
import os
import sys

import keras
import tensorflow as tf  # noqa: F401  (Keras picks its default backend, TensorFlow)

import trainrun.keras as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic import mnist_like, report  # noqa: E402


def lenet():
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(6, 5, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(16, 5, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dense(120, activation="relu"),
        keras.layers.Dense(84, activation="relu"), keras.layers.Dense(10, activation="softmax")])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40, help="steps per epoch on each rank")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--checkpoint", default="./checkpoint-keras-mnist.keras")
    parser.add_argument("--report", default="", help="write losses and a weight digest per rank to REPORT.rankN.json")
    args = parser.parse_args()

    hvd.init()
    x, y = mnist_like(args.steps * args.batch_size, seed=hvd.rank())
    x = x[..., None].astype("float32") / 255.0

    model = lenet()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adadelta(1.0 * hvd.size()))
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                 hvd.callbacks.LearningRateWarmupCallback(initial_lr=1.0 * hvd.size(), warmup_epochs=1)]
    if hvd.rank() == 0:
        callbacks.append(keras.callbacks.ModelCheckpoint(args.checkpoint))
    verbose = 2 if hvd.rank() == 0 else 0
    history = model.fit(x, y, batch_size=args.batch_size, steps_per_epoch=args.steps, epochs=args.epochs,
                        callbacks=callbacks, verbose=verbose)
    losses = history.history["loss"]

    hvd.barrier()  # rank 0's checkpoint is on disk
    resumed = hvd.load_model(args.checkpoint)  # the same optimizer class and state, distributed again
    assert type(resumed.optimizer).__mro__[1].__module__.startswith("trainrun"), type(resumed.optimizer).__mro__
    history = resumed.fit(x, y, batch_size=args.batch_size, steps_per_epoch=args.steps, epochs=1, verbose=verbose,
                          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                     hvd.callbacks.MetricAverageCallback()])
    losses += history.history["loss"]
    if hvd.rank() == 0:
        print(f"losses by epoch {[round(v, 4) for v in losses]} (the last after load_model)")
    if args.report:
        report(args.report, hvd.rank(), losses, resumed.get_weights())


if __name__ == "__main__":
    main()
