"""trainrun.keras on Keras 3 (torch backend): fit with DistributedOptimizer and Horovod's callbacks
equals single-process training on the concatenated batches (run by tests/runtime/test_keras.py)."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import trainrun.keras as hvd  # noqa: E402
import keras  # noqa: E402  (trainrun.keras chose the torch backend)
from harness import case, main  # noqa: E402

B, STEPS, D = 8, 6, 5  # per-rank batch, steps per epoch, features


def shard(rank, seed=0):
    rng = np.random.default_rng(seed * 100 + rank)
    x = rng.normal(size=(B * STEPS, D)).astype("float32")
    y = (x @ np.arange(1, D + 1, dtype="float32")[:, None] + 0.1 * rng.normal(size=(B * STEPS, 1))).astype("float32")
    return x, y


def model_for(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((D,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])


def joined(per_step):
    """All ranks' data, step by step: step i of the reference is step i of every rank, concatenated."""
    shards = [shard(r) for r in range(hvd.size())]
    xs = np.concatenate([np.concatenate([s[0][i * per_step:(i + 1) * per_step] for s in shards])
                         for i in range(B * STEPS // per_step)])
    ys = np.concatenate([np.concatenate([s[1][i * per_step:(i + 1) * per_step] for s in shards])
                         for i in range(B * STEPS // per_step)])
    return xs, ys


class Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses, self.lrs = [], []

    def on_epoch_end(self, epoch, logs=None):
        self.losses.append(float(logs["loss"]))

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(self.model.optimizer.learning_rate.numpy()))


def train(optimizer, epochs=2, compression=None, **dist):
    """fit on this rank's shard from a rank-specific initialization (the broadcast fixes it); returns
    (model, rank 0's initial weights, losses before/after averaging)."""
    model = model_for(100 + hvd.rank())
    model.compile(optimizer=hvd.DistributedOptimizer(optimizer, compression=compression or hvd.Compression.none, **dist),
                  loss="mse")
    init0 = hvd.broadcast_object(model.get_weights(), 0)
    before, after = Record(), Record()
    x, y = shard(hvd.rank())
    model.fit(x, y, batch_size=B, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), before,
                         hvd.callbacks.MetricAverageCallback(), after])
    return model, init0, before.losses, after.losses


def reference(init0, optimizer, batch, epochs=2):
    model = model_for(0)
    model.compile(optimizer=optimizer, loss="mse")
    model.set_weights(init0)
    x, y = joined(batch // hvd.size())
    model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0)
    return model.get_weights()


def same_everywhere(weights):
    gathered = hvd.allgather_object([w.tolist() for w in weights])
    assert all(g == gathered[0] for g in gathered), "ranks hold different weights after training"


@case
def fit_matches_single_process():
    model, init0, before, after = train(keras.optimizers.SGD(0.05, momentum=0.9))
    same_everywhere(model.get_weights())
    want = reference(init0, keras.optimizers.SGD(0.05, momentum=0.9), B * hvd.size())
    for got, w in zip(model.get_weights(), want):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5)
    # MetricAverageCallback: every rank's history holds the mean of the ranks' own losses
    all_before = hvd.allgather_object(before)
    np.testing.assert_allclose(after, np.mean(all_before, axis=0), rtol=1e-6)
    assert hvd.allgather_object(after) == [after] * hvd.size()
    assert int(model.optimizer.iterations.numpy()) == 2 * STEPS


@case
def backward_passes_per_step_2():
    model, init0, _, _ = train(keras.optimizers.SGD(0.05), backward_passes_per_step=2,
                               average_aggregated_gradients=True)
    same_everywhere(model.get_weights())
    want = reference(init0, keras.optimizers.SGD(0.05), 2 * B * hvd.size())
    for got, w in zip(model.get_weights(), want):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5)
    assert int(model.optimizer.iterations.numpy()) == STEPS  # one update per two passes


@case
def fp16_compression():
    model, init0, _, _ = train(keras.optimizers.SGD(0.05), compression=hvd.Compression.fp16)
    same_everywhere(model.get_weights())
    want = reference(init0, keras.optimizers.SGD(0.05), B * hvd.size())
    for got, w in zip(model.get_weights(), want):
        np.testing.assert_allclose(got, w, rtol=2e-2, atol=2e-3)


@case
def learning_rate_warmup():
    model = model_for(7)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    rec = Record()
    x, y = shard(hvd.rank())
    model.fit(x, y, batch_size=B, epochs=3, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=2), rec])
    n = hvd.size()
    want = [0.1 / n * (min(e + (b + 1) / STEPS, 2) * (n - 1) / 2 + 1) for e in range(2) for b in range(STEPS)]
    np.testing.assert_allclose(rec.lrs[:2 * STEPS], want, rtol=1e-6)
    np.testing.assert_allclose(rec.lrs[2 * STEPS:], 0.1, rtol=1e-6)  # left alone after the warm-up
    assert rec.lrs[0] < 0.1 / n * 1.5


@case
def ops_on_keras_values():
    n, me = hvd.size(), hvd.rank()
    v = keras.Variable(np.full((2, 3), float(me), dtype="float32"))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(hvd.allreduce(v, name="k.v")), np.full((2, 3), (n - 1) / 2))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(hvd.allreduce(np.ones(3), op=hvd.Sum)), np.full(3, n))
    got = keras.ops.convert_to_numpy(hvd.allgather(np.full((me + 1, 2), me), name="k.g"))
    assert got.shape == (sum(range(1, n + 1)), 2)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(hvd.broadcast(np.array([me, me]), 1, name="k.b")), [1, 1])
    hvd.broadcast_variables([v], root_rank=1, prefix="k.bv")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(v), np.ones((2, 3)))


@case
def optimizer_errors():
    for kwargs, fragment in [({"op": hvd.Sum, "gradient_predivide_factor": 2.0}, "gradient_predivide_factor"),
                             ({"backward_passes_per_step": 0}, "backward_passes_per_step")]:
        try:
            hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), **kwargs)
        except ValueError as e:
            assert fragment in str(e), e
        else:
            raise AssertionError(f"{kwargs} did not raise ValueError")
    try:
        hvd.DistributedOptimizer("sgd")
    except ValueError as e:
        assert "keras.optimizers.Optimizer" in str(e)
    else:
        raise AssertionError("a string optimizer did not raise ValueError")


@case
def partial_distributed_optimizer_keeps_local_layers_local():
    """horovod.keras.PartialDistributedOptimizer(local_layers=[...]) in fit: the shared layer's gradient is
    averaged over the ranks, the local layer's is this rank's own over the size (scale_local_gradients);
    with scale_local_gradients=False it is this rank's own; a non-layer is refused."""
    r, n = hvd.rank(), hvd.size()
    grads = [2.0 * (k + 1) ** 2 for k in range(n)]  # d/dk of (x k1 k2)^2 at k1 = k2 = 1, x = rank + 1
    for scale, local_step in ((True, grads[r] / n), (False, grads[r])):
        shared = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
        local = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
        model = keras.Sequential([keras.Input((1,)), shared, local])
        opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.01), local_layers=local,
                                              scale_local_gradients=scale)
        model.compile(optimizer=opt, loss="mse")
        model.fit(np.full((1, 1), r + 1.0, np.float32), np.zeros((1, 1), np.float32), batch_size=1, epochs=1,
                  verbose=0)
        np.testing.assert_allclose(shared.kernel.numpy(), [[1 - 0.01 * sum(grads) / n]], rtol=1e-5)
        np.testing.assert_allclose(local.kernel.numpy(), [[1 - 0.01 * local_step]], rtol=1e-5)
    try:
        hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=["not a layer"])
    except ValueError as e:
        assert "keras.layers.Layer" in str(e), e
    else:
        raise AssertionError("a local layer that is no Layer did not raise ValueError")


if __name__ == "__main__":
    main(hvd)
