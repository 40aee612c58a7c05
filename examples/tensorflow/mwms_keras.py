"""TensorFlow's own multi-worker strategy, launched by trainrun: `trainrun -np 2 python mwms_keras.py`.

Nothing here is trainrun's: the script reads TF_CONFIG (which trainrun sets for every rank: every worker's
address on the job's network and a port free on its host; task index = rank) through
tf.distribute.MultiWorkerMirroredStrategy, as it would under any other launcher. Keras 2 (tf-keras) is used
because Keras 3's `fit` refuses this strategy ("unsupported type (PerReplica)"): install it with
`pip install --no-deps tf-keras==2.21.0`. Synthetic MNIST-shaped data; prints each worker's final weights digest.
"""
import argparse
import hashlib
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--batch", type=int, default=32, help="per worker")
args = ap.parse_args()

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
workers = strategy.num_replicas_in_sync
rng = np.random.default_rng(0)  # the same data on every worker; the strategy shards it
x = rng.random((args.steps * args.batch * workers, 28, 28, 1), dtype=np.float32)
y = (x.reshape(len(x), -1).mean(axis=1) * 10).astype(np.int64) % 10
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch * workers)

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(8, 3, activation="relu", input_shape=(28, 28, 1)),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(10),
    ])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
history = model.fit(dataset, epochs=1, steps_per_epoch=args.steps, verbose=0)
digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"worker {task} of {workers}: loss {history.history['loss'][-1]:.4f} weights {digest}", flush=True)
