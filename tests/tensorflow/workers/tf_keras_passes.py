"""tf-keras (Keras 2, TF_USE_LEGACY_KERAS=1, set by the test before TensorFlow loads) on 2 ranks: fit
with DistributedOptimizer around new and legacy optimizers, backward_passes_per_step 1 and 2 inside
fit's compiled step, equal to single-process training on every rank's batches together."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "runtime", "workers"))
import tensorflow as tf  # noqa: E402
import trainrun.tensorflow.keras as hvd  # noqa: E402
from harness import case, main  # noqa: E402

keras = tf.keras
B, D, STEPS = 8, 5, 5


def data(rank):
    rng = np.random.default_rng(7 + rank)
    x = rng.normal(size=(B * STEPS, D)).astype("float32")
    return x, (x @ np.linspace(-1, 1, D, dtype="float32")[:, None]).astype("float32")


def model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.layers.Dense(4, activation="tanh", input_shape=(D,)), keras.layers.Dense(1)])


@case
def legacy_and_new_optimizers_with_passes():
    assert keras.__name__.startswith("tf_keras"), keras.__name__
    shards = [data(r) for r in range(hvd.size())]
    n = B * hvd.size()
    xs = np.concatenate([np.concatenate([s[0][i * B:(i + 1) * B] for s in shards]) for i in range(STEPS)])
    ys = np.concatenate([np.concatenate([s[1][i * B:(i + 1) * B] for s in shards]) for i in range(STEPS)])
    for make in (lambda: keras.optimizers.legacy.SGD(0.05, momentum=0.5), lambda: keras.optimizers.Adam(0.01)):
        for passes in (1, 2):
            m = model()
            opt = hvd.DistributedOptimizer(make(), backward_passes_per_step=passes, average_aggregated_gradients=True)
            m.compile(optimizer=opt, loss="mse")
            x, y = shards[hvd.rank()]
            m.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
            assert int(opt.iterations.numpy()) == STEPS // passes, (passes, int(opt.iterations.numpy()))
            got = m.get_weights()
            gathered = hvd.allgather_object([w.tolist() for w in got])
            assert all(g == gathered[0] for g in gathered), "ranks hold different weights"
            ref = model()
            ref.compile(optimizer=make(), loss="mse")
            k = STEPS // passes * passes * n
            ref.fit(xs[:k], ys[:k], batch_size=passes * n, epochs=1, shuffle=False, verbose=0)
            for a, b in zip(got, ref.get_weights()):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
    main(hvd)
