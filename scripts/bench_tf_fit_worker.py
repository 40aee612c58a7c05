"""One rank of scripts/bench_tf_fit.py: Keras `fit` of the issue's program-2 CNN (Horovod's MNIST CNN at the
example's widths) on synthetic MNIST-shaped data, timed after a warm-up. MODE: hvd (trainrun.tensorflow.keras,
Keras 3), mwms (tf.distribute.MultiWorkerMirroredStrategy from TF_CONFIG, tf-keras), single (one process, no
communication, Keras 3). Prints `RESULT {json}` on worker 0."""
import json
import os
import sys
import time

MODE = sys.argv[1]
STEPS, WARMUP, BATCH = int(sys.argv[2]), int(sys.argv[3]), 64
if MODE == "mwms":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def cnn():
    return tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(8, [3, 3], activation="relu"),
        tf.keras.layers.Conv2D(16, [3, 3], activation="relu"),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation="softmax")])


class Timer(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times = []

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter())


rng = np.random.default_rng(0)
x = rng.random((2048, 28, 28, 1), dtype=np.float32)
y = rng.integers(0, 10, 2048)
workers, index, callbacks = 1, 0, []
if MODE == "hvd":
    import trainrun.tensorflow.keras as hvd

    hvd.init()
    workers, index = hvd.size(), hvd.rank()
    model = cnn()
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.001 * workers))
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(1000, seed=index).batch(BATCH)
elif MODE == "mwms":
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers, index = strategy.num_replicas_in_sync, json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    with strategy.scope():
        model = cnn()
        model.compile(loss="sparse_categorical_crossentropy", optimizer=tf.keras.optimizers.Adam(0.001 * workers),
                      metrics=["accuracy"])
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(1000).batch(BATCH * workers)  # global batch
else:
    model = cnn()
    model.compile(loss="sparse_categorical_crossentropy", optimizer=tf.keras.optimizers.Adam(0.001), metrics=["accuracy"])
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(1000).batch(BATCH)
timer = Timer()
model.fit(data, steps_per_epoch=WARMUP + STEPS, epochs=1, verbose=0, callbacks=callbacks + [timer])
t = timer.times[WARMUP:]
if index == 0:
    print("RESULT " + json.dumps({"mode": MODE, "workers": workers, "step_s": (t[-1] - t[0]) / (len(t) - 1)}), flush=True)
