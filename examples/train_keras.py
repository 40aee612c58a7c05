"""A Horovod-style Keras training script on trainrun (Keras 3, torch backend; only the import
differs from Horovod's `horovod.keras`).

    trainrun -np 2 python examples/train_keras.py        (or: mpiexec -n 2 python examples/train_keras.py)

Synthetic regression data, a small MLP, a few epochs: finishes in seconds on CPU.
The pattern: init; shard the data by rank; scale the learning rate by the number of ranks; wrap the
optimizer; broadcast the initial state from rank 0 and average metrics (callbacks); warm the
learning rate up; print and checkpoint only on rank 0.
"""
import argparse

import trainrun.keras as hvd  # first: with Keras not yet imported and KERAS_BACKEND unset, it selects torch

import keras  # noqa: E402
import numpy as np  # noqa: E402


def synthetic_shard(n, rank, size, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 16)).astype("float32")
    y = (np.tanh(x @ rng.normal(size=(16, 1))) + 0.05 * rng.normal(size=(n, 1))).astype("float32")
    return x[rank::size], y[rank::size]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--checkpoint", default="", help="path of a .keras file rank 0 saves at each epoch end")
    args = parser.parse_args()

    hvd.init()
    if hvd.rank() == 0:
        print(f"{hvd.size()} ranks, Keras {keras.__version__} on the {keras.backend.backend()} backend")
    x, y = synthetic_shard(args.samples, hvd.rank(), hvd.size())
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9))
    model.compile(optimizer=optimizer, loss="mse", metrics=["mae"])
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback(),
                 hvd.callbacks.LearningRateWarmupCallback(args.lr * hvd.size(), warmup_epochs=min(2, args.epochs))]
    if hvd.rank() == 0 and args.checkpoint:
        callbacks.append(keras.callbacks.ModelCheckpoint(args.checkpoint))
    history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, shuffle=True,
                        verbose=0, callbacks=callbacks)
    if hvd.rank() == 0:
        for epoch, (loss, mae) in enumerate(zip(history.history["loss"], history.history["mae"])):
            print(f"epoch {epoch}: loss {loss:.4f} mae {mae:.4f} (averaged over {hvd.size()} ranks)")
    hvd.shutdown()


if __name__ == "__main__":
    main()
