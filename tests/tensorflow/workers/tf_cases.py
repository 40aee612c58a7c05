"""trainrun.tensorflow, trainrun.tensorflow.keras and trainrun.keras (TensorFlow backend) on 2 ranks,
one launch (run by tests/tensorflow/test_tensorflow.py): collectives eagerly, in tf.function and in
TF1 graphs; their gradients; and training that must equal single-process training on the
concatenated batches (TF1 DistributedOptimizer, DistributedGradientTape, Keras fit)."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "runtime", "workers"))
import tensorflow as tf  # noqa: E402
import trainrun.tensorflow as hvd  # noqa: E402
import trainrun.tensorflow.keras as hvdk  # noqa: E402
from harness import case, expect, main  # noqa: E402

keras = tf.keras
B, D, STEPS = 8, 6, 5  # per-rank batch, features, steps


def shard(rank):
    rng = np.random.default_rng(100 + rank)
    x = rng.normal(size=(B * STEPS, D)).astype("float32")
    y = (x @ np.linspace(-1, 1, D, dtype="float32")[:, None] + 0.1 * rng.normal(size=(B * STEPS, 1))).astype("float32")
    return x, y


def joined():
    """Step i of the single-process reference: every rank's batch i, concatenated."""
    shards = [shard(r) for r in range(hvd.size())]
    xs = np.concatenate([np.concatenate([s[0][i * B:(i + 1) * B] for s in shards]) for i in range(STEPS)])
    ys = np.concatenate([np.concatenate([s[1][i * B:(i + 1) * B] for s in shards]) for i in range(STEPS)])
    return xs, ys


def same_everywhere(arrays):
    gathered = hvd.allgather_object([np.asarray(a).tolist() for a in arrays])
    assert all(g == gathered[0] for g in gathered), "ranks hold different values"


def close(a, b, tol=1e-5):
    for u, v in zip(a, b):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=tol, atol=tol)


# ---- collectives ----------------------------------------------------------------------------
def check_ops(run):
    """`run(fn, *args)` runs fn eagerly or in a tf.function."""
    r, n = hvd.rank(), hvd.size()
    x = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3) + r)
    base = np.arange(6, dtype=np.float32).reshape(2, 3)
    close([run(lambda t: hvd.allreduce(t), x)], [base + (n - 1) / 2])
    close([run(lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5), x)],
          [sum(base + k for k in range(n))])
    close([run(lambda t: hvd.allreduce(t, op=hvd.Max), x)], [base + n - 1])
    close([run(lambda t: hvd.allreduce(t, op=hvd.Min), x)], [base])
    g = run(lambda t: hvd.allgather(t[:r + 1]), x)  # uneven first dimensions
    close([g], [np.concatenate([(base + k)[:k + 1] for k in range(n)])])
    close([run(lambda t: hvd.broadcast(t, 1), x)], [base + 1])
    out = run(lambda t: hvd.grouped_allreduce([t, tf.cast(t, tf.float64) * 2, tf.cast(t, tf.int32)], op=hvd.Sum), x)
    total = sum(base + k for k in range(n))
    close(out, [total, 2 * total, total])
    assert out[1].dtype == tf.float64 and out[2].dtype == tf.int32
    y, received = run(lambda t: hvd.alltoall(tf.reshape(tf.range(4, dtype=tf.float32) + 10 * r, [4, 1]),
                                             splits=[1, 3] if r == 0 else [2, 2]), x)
    assert np.asarray(received).tolist() == ([1, 2] if r == 0 else [3, 2]), received
    expected = np.array([[0], [10], [11]] if r == 0 else [[1], [2], [3], [12], [13]], np.float32)
    close([y], [expected])
    close([run(lambda t: hvd.reducescatter(t, op=hvd.Sum), x)], [total[r:r + 1]])
    h = run(lambda t: hvd.allreduce(tf.cast(t, tf.bfloat16), op=hvd.Sum), x)
    assert h.dtype == tf.bfloat16
    close([tf.cast(h, tf.float32)], [total], tol=1e-2)


@case
def ops_eager():
    check_ops(lambda fn, *a: fn(*a))


@case
def eager_results_keep_their_values():
    """The eager allreduce writes pooled result buffers (tensorflow/buffers.py): results the program
    still holds are never reused, whatever it keeps (tensors, their .numpy() arrays); Average,
    pre/postscale and integer dtypes on that path; the input is never written."""
    r = hvd.rank()
    x = tf.constant(np.full(8, r + 1, np.float32))
    kept = [hvd.allreduce(x * (i + 1), op=hvd.Sum) for i in range(12)]  # more than the pool keeps per size
    arrays = [hvd.allreduce(x * (i + 1), op=hvd.Sum).numpy() for i in range(6)]  # tensors dropped, arrays kept
    for _ in range(10):
        hvd.allreduce(x * 100.0, op=hvd.Sum)  # free buffers get reused...
    for i, t in enumerate(kept):  # ...but not these
        close([t], [np.full(8, 3.0 * (i + 1))])
    for i, a in enumerate(arrays):
        close([a], [np.full(8, 3.0 * (i + 1))])
    close([x], [np.full(8, r + 1)])
    close([hvd.allreduce(x), hvd.allreduce(x, prescale_factor=2.0, postscale_factor=0.5, op=hvd.Sum)],
          [np.full(8, 1.5), np.full(8, 3.0)])
    ints = hvd.allreduce(tf.constant([r + 1, 7], tf.int64), op=hvd.Sum)
    assert ints.dtype == tf.int64 and ints.numpy().tolist() == [3, 14], ints


@case
def ops_in_tf_function():
    check_ops(lambda fn, *a: tf.function(fn)(*a))


@case
def ops_in_tf1_graph():
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None])
        ops = [hvd.allreduce(x, op=hvd.Sum), hvd.allgather(x), hvd.broadcast(x, 1)]
        with tf.compat.v1.Session() as sess:
            for step in range(3):  # a graph op keeps its name across runs
                s, g, b = sess.run(ops, {x: np.full(2, hvd.rank() + step, np.float32)})
                close([s, g, b], [np.full(2, 1 + 2 * step), np.repeat([step, step + 1], 2), np.full(2, step + 1)])


@case
def indexed_slices_are_gathered():
    sl = tf.IndexedSlices(tf.constant([[1.0, 2.0]]) * (hvd.rank() + 1), tf.constant([hvd.rank()]),
                          dense_shape=tf.constant([2, 2]))
    out = hvd.allreduce(sl)
    assert isinstance(out, tf.IndexedSlices)
    close([out.values, out.indices], [[[0.5, 1.0], [1.0, 2.0]], [0, 1]])


@case
def gradients_eager_and_graph():
    r = hvd.rank()
    v = tf.Variable(np.ones((2, 3), np.float32) * (r + 1))

    def grads():
        out = []
        for op in (lambda t: hvd.allreduce(t, op=hvd.Sum), hvd.allgather, lambda t: hvd.broadcast(t, 0),
                   lambda t: hvd.reducescatter(t, op=hvd.Sum)):
            with tf.GradientTape() as tape:
                y = tf.reduce_sum(op(v) * (r + 1.0))
            out.append(tape.gradient(y, v))
        return out
    expected = [np.full((2, 3), 3.0),  # allreduce: the summed upstream gradient 1 + 2
                np.full((2, 3), 1.5),  # allgather: this rank's rows of the averaged gradient (Horovod's TF)
                np.full((2, 3), 1.5 if r == 0 else 0.0),  # broadcast: to the root only
                np.full((2, 3), [[2.0] * 3, [4.0] * 3])]  # reducescatter(Sum): the gathered slices, times size
    close(grads(), expected)
    close(tf.function(grads)(), expected)


@case
def broadcast_variables_and_objects():
    v = tf.Variable(np.full(3, hvd.rank(), np.float32))
    hvd.broadcast_variables([v], root_rank=1)
    close([v], [np.full(3, 1.0)])
    assert hvd.broadcast_object({"r": hvd.rank()}, 1) == {"r": 1}
    assert hvd.allgather_object(hvd.rank()) == list(range(hvd.size()))
    expect(RuntimeError, lambda: hvd.broadcast_global_variables(0), "eager")
    expect(NotImplementedError, lambda: hvd.allreduce(tf.ones(2), op=hvd.Adasum), "Adasum")


# ---- training equals single-process training --------------------------------------------------
def dense_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((D,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])


@case
def gradient_tape_in_tf_function_matches_single_process():
    """Shape 4: DistributedGradientTape in @tf.function, broadcast after the first step."""
    def train(model, opt, batches, distributed):
        @tf.function
        def step(x, y, first):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            if distributed:
                tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            if distributed and first:
                hvd.broadcast_variables(model.variables, root_rank=0)
                hvd.broadcast_variables(opt.variables, root_rank=0)
            return loss
        return [float(step(x, y, i == 0)) for i, (x, y) in enumerate(batches)]
    x, y = shard(hvd.rank())
    xs, ys = joined()
    model = dense_model(7)  # one seed: the first step's gradients come from the same weights everywhere
    before = float(tf.reduce_mean((model(xs) - ys) ** 2))
    train(model, keras.optimizers.Adam(0.01), [(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B])
                                                        for i in range(STEPS)], True)
    ref = dense_model(7)
    n = B * hvd.size()
    train(ref, keras.optimizers.Adam(0.01), [(xs[i * n:(i + 1) * n], ys[i * n:(i + 1) * n]) for i in range(STEPS)],
          False)
    close(model.get_weights(), ref.get_weights())
    same_everywhere(model.get_weights())
    after = float(tf.reduce_mean((model(xs) - ys) ** 2))
    assert after < before, (before, after)


@case
def tf1_distributed_optimizer_matches_single_process():
    """Shape 1: a tf.compat.v1 graph, AdagradOptimizer wrapped, broadcast_global_variables in a plain session."""
    def run(xs, ys, n, distributed, seed):
        with tf.Graph().as_default():
            tf.compat.v1.set_random_seed(seed)
            x = tf.compat.v1.placeholder(tf.float32, [None, D])
            y = tf.compat.v1.placeholder(tf.float32, [None, 1])
            w = tf.compat.v1.get_variable("w", [D, 1], initializer=tf.compat.v1.random_normal_initializer(seed=seed))
            b = tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.zeros_initializer())
            loss = tf.reduce_mean((tf.matmul(x, w) + b - y) ** 2)
            opt = tf.compat.v1.train.AdagradOptimizer(0.1)
            if distributed:
                opt = hvd.DistributedOptimizer(opt)
            train_op = opt.minimize(loss)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                if distributed:
                    sess.run(hvd.broadcast_global_variables(0))
                losses = [sess.run([train_op, loss], {x: xs[i * n:(i + 1) * n], y: ys[i * n:(i + 1) * n]})[1]
                          for i in range(STEPS)]
                return sess.run([w, b]), losses
    x, y = shard(hvd.rank())
    weights, losses = run(x, y, B, True, seed=hvd.rank())  # ranks start apart: the broadcast fixes that
    root_init = 0
    xs, ys = joined()
    ref, _ = run(xs, ys, B * hvd.size(), False, seed=root_init)
    close(weights, ref)
    same_everywhere(weights)
    assert losses[-1] < losses[0], losses


@case
def tf1_backward_passes_per_step():
    """tf.compat.v1 DistributedOptimizer(backward_passes_per_step=2) in a graph: gradients accumulate in
    variables, every second run reduces and applies them (averaged: average_aggregated_gradients), every
    run advances global_step; equal to single-process Adagrad on the two runs' batches of every rank."""
    def run(xs, ys, n, passes, distributed, runs):
        with tf.Graph().as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, D])
            y = tf.compat.v1.placeholder(tf.float32, [None, 1])
            w = tf.compat.v1.get_variable("w", [D, 1], initializer=tf.compat.v1.random_normal_initializer(seed=3))
            b = tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.zeros_initializer())
            loss = tf.reduce_mean((tf.matmul(x, w) + b - y) ** 2)
            step = tf.compat.v1.train.get_or_create_global_step()
            opt = tf.compat.v1.train.AdagradOptimizer(0.1)
            if distributed:
                opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=passes, average_aggregated_gradients=True)
            train_op = opt.minimize(loss, global_step=step)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for i in range(runs):
                    sess.run(train_op, {x: xs[i * n:(i + 1) * n], y: ys[i * n:(i + 1) * n]})
                return sess.run([w, b]), sess.run(step)
    x, y = shard(hvd.rank())
    weights, steps = run(x, y, B, 2, True, STEPS)
    assert steps == STEPS, steps  # every run advances global_step, as in Horovod
    xs, ys = joined()
    ref, _ = run(xs, ys, 2 * B * hvd.size(), 1, False, STEPS // 2)  # one update per two runs' batches
    close(weights, ref)
    same_everywhere(weights)


def keras_fit(hvd_module, optimizer, data, epochs=2, **fit):
    model = dense_model(100 + hvd.rank())  # apart until BroadcastGlobalVariablesCallback
    model.compile(optimizer=hvd_module.DistributedOptimizer(optimizer), loss="mse")
    init0 = hvd.broadcast_object(model.get_weights(), 0)
    history = model.fit(data, epochs=epochs, verbose=0, **fit,
                        callbacks=[hvd_module.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd_module.callbacks.MetricAverageCallback()])
    return model, init0, history.history["loss"]


def keras_reference(init0, optimizer, epochs=2):
    model = dense_model(0)
    model.compile(optimizer=optimizer, loss="mse")
    model.set_weights(init0)
    xs, ys = joined()
    model.fit(xs, ys, batch_size=B * hvd.size(), epochs=epochs, shuffle=False, verbose=0)
    return model.get_weights()


@case
def tf_keras_fit_with_tf_data_matches_single_process():
    """Shape 2: trainrun.tensorflow.keras, fit on a tf.data pipeline inside fit's tf.function."""
    x, y = shard(hvd.rank())
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(B)
    model, init0, losses = keras_fit(hvdk, keras.optimizers.SGD(0.05, momentum=0.5), data)
    close(model.get_weights(), keras_reference(init0, keras.optimizers.SGD(0.05, momentum=0.5)))
    same_everywhere(model.get_weights())
    assert losses[-1] < losses[0], losses


@case
def keras_on_tensorflow_backend_fit_and_load_model():
    """Shape 3: trainrun.keras on Keras 3's TensorFlow backend, NumPy arrays, load_model."""
    import keras as keras3
    import trainrun.keras as hvd3
    assert keras3.backend.backend() == "tensorflow"
    x, y = shard(hvd.rank())
    model, init0, _ = keras_fit(hvd3, keras3.optimizers.Adam(0.01), x, y=y, batch_size=B, shuffle=False)
    close(model.get_weights(), keras_reference(init0, keras3.optimizers.Adam(0.01)), tol=1e-4)
    same_everywhere(model.get_weights())
    path = os.path.join(sys.argv[1], f"model{hvd.rank()}.keras")
    model.save(path)
    loaded = hvd3.load_model(path)
    assert type(loaded.optimizer).__name__ == "Adam" and hasattr(loaded.optimizer, "_trainrun")
    assert int(loaded.optimizer.iterations.numpy()) == 2 * STEPS
    loaded.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    same_everywhere(loaded.get_weights())


@case
def keras_optimizer_errors():
    expect(ValueError, lambda: hvdk.DistributedOptimizer(object()), "keras.optimizers.Optimizer")
    expect(ValueError, lambda: hvdk.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Adasum), "Adasum")


@case
def keras_fit_accumulates_passes_in_graph():
    """backward_passes_per_step=2 in fit's compiled step (not run_eagerly): one update per two passes, equal
    to single-process training on the two steps' batches of every rank together; the odd last pass is
    kept, not applied."""
    for average in (True, False):
        model = dense_model(3)
        opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05), backward_passes_per_step=2,
                                        average_aggregated_gradients=average)
        model.compile(optimizer=opt, loss="mse")
        x, y = shard(hvd.rank())
        model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)  # STEPS = 5 passes: 2 updates
        assert int(opt.iterations.numpy()) == STEPS // 2, int(opt.iterations.numpy())
        same_everywhere(model.get_weights())
        ref = dense_model(3)
        ref.compile(optimizer=keras.optimizers.SGD(0.05 if average else 0.1), loss="mse")  # a sum: twice the step
        xs, ys = joined()
        n = 2 * B * hvd.size()
        ref.fit(xs[:2 * n], ys[:2 * n], batch_size=n, epochs=1, shuffle=False, verbose=0)
        close(model.get_weights(), ref.get_weights())


if __name__ == "__main__":
    main(hvd)
