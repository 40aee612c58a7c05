"""One process of scripts/bench_ps.py: Keras `fit` of the MNIST CNN (bench_tf_fit_worker.py's) on synthetic
MNIST-shaped data, 64 samples per worker per step, timed per epoch after a warm-up epoch. MODE: ps
(ParameterServerStrategy from TF_CONFIG, tf-keras; workers and ps serve, the chief fits), mwms
(MultiWorkerMirroredStrategy, tf-keras), hvd (trainrun.tensorflow.keras, Keras 3), single (one process, no
communication, Keras 3). The chief / rank 0 prints `RESULT {json}`: seconds per step and the workers that step."""
import json
import os
import socket
import sys
import time

MODE = sys.argv[1]
STEPS, EPOCHS, BATCH = int(sys.argv[2]), int(sys.argv[3]), 64
if MODE in ("ps", "mwms"):
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


class EpochTimer(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times = []

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter())


def compile_(model, workers):
    model.compile(loss="sparse_categorical_crossentropy", optimizer=tf.keras.optimizers.Adam(0.001 * workers))


rng = np.random.default_rng(0)
x = rng.random((2048, 28, 28, 1), dtype=np.float32)
y = rng.integers(0, 10, 2048)
workers, first, callbacks = 1, True, []
if MODE == "ps":
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster = resolver.cluster_spec()
    if resolver.task_type in ("worker", "ps"):
        tf.distribute.Server(cluster, job_name=resolver.task_type, task_index=resolver.task_id, start=True).join()
    for address in cluster.job_tasks("ps") + cluster.job_tasks("worker"):
        host, port = address.rsplit(":", 1)
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=2).close()
                break
            except OSError:
                time.sleep(0.1)
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    workers = len(cluster.job_tasks("worker"))
    with strategy.scope():
        model = cnn()
        compile_(model, 1)  # asynchronous: each step is one worker's batch
    data = tf.keras.utils.experimental.DatasetCreator(
        lambda ctx: tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(1000).batch(BATCH))
elif MODE == "mwms":
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync
    first = json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0
    with strategy.scope():
        model = cnn()
        compile_(model, workers)
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(1000).batch(BATCH * workers)  # global batch
elif MODE == "hvd":
    import trainrun.tensorflow.keras as hvd

    hvd.init()
    workers, first = hvd.size(), hvd.rank() == 0
    model = cnn()
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.001 * workers)))
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(1000, seed=hvd.rank()).batch(BATCH)
else:
    model = cnn()
    compile_(model, 1)
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(1000).batch(BATCH)
timer = EpochTimer()
model.fit(data, steps_per_epoch=STEPS, epochs=EPOCHS + 1, verbose=0, callbacks=callbacks + [timer])
per_epoch = sorted(b - a for a, b in zip(timer.times, timer.times[1:]))  # the first epoch (warm-up) left out
if first:
    print("RESULT " + json.dumps({"mode": MODE, "workers": workers, "step_s": per_epoch[len(per_epoch) // 2] / STEPS}),
          flush=True)
