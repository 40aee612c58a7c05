"""TensorFlow 2 parameter-server training with Keras `fit`, launched by trainrun:

    trainrun -np 4 --tf-cluster ps=1 python ps_keras.py      # 1 chief, 2 workers, 1 ps

The same shape as ps_strategy.py (one file, branching on the task type that TF_CONFIG names; workers and ps
serve until trainrun stops them after the chief's fit), with Keras doing the loop: under
ParameterServerStrategy, `model.fit` makes its own ClusterCoordinator. Keras 2 (tf-keras, with
TF_USE_LEGACY_KERAS=1, set below) is needed: Keras 3 refuses this strategy (its fit and compile have no
ParameterServerStrategy support). Install it with `pip install --no-deps tf-keras==<your TensorFlow version>`.
"""
import argparse
import json
import os
import socket
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic import mnist_like  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=8)
ap.add_argument("--steps", type=int, default=5, help="steps per epoch")
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--out", help="chief: write {'losses': [...]} (the loss per epoch) here")
args = ap.parse_args()

tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
cluster = resolver.cluster_spec()

if resolver.task_type in ("worker", "ps"):
    server = tf.distribute.Server(cluster, job_name=resolver.task_type, task_index=resolver.task_id,
                                  protocol=resolver.rpc_layer or "grpc", start=True)
    server.join()  # until trainrun stops it
    sys.exit(0)
if resolver.task_type == "evaluator":
    sys.exit(0)

for address in cluster.job_tasks("ps") + cluster.job_tasks("worker"):  # every server up before connecting
    host, port = address.rsplit(":", 1)
    for _ in range(600):
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            break
        except OSError:
            time.sleep(0.2)

strategy = tf.distribute.ParameterServerStrategy(resolver)
images, labels = mnist_like(4096)


def dataset_fn(input_context):
    x = tf.cast(tf.reshape(images, [-1, 784]), tf.float32) / 255.0
    return tf.data.Dataset.from_tensor_slices((x, labels)).shuffle(4096, seed=0).repeat().batch(args.batch)


with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu", input_shape=(784,)),
                                 tf.keras.layers.Dense(10)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.2),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=1)

# batch-level callbacks are refused under this strategy: the loss is read per epoch
creator = getattr(tf.keras.utils, "experimental", None)  # tf-keras; Keras 3 has no DatasetCreator: a dataset
data = creator.DatasetCreator(dataset_fn) if creator else dataset_fn(None)
history = model.fit(data, epochs=args.epochs,
                    steps_per_epoch=args.steps, verbose=0)
seen = [float(v) for v in history.history["loss"]]
keras = "tf-keras" if os.environ["TF_USE_LEGACY_KERAS"] == "1" else "keras 3"
print(f"chief: {keras}, fit {len(seen)} epochs, loss {seen[0]:.4f} -> {seen[-1]:.4f}", flush=True)
if args.out:
    with open(args.out, "w") as f:
        json.dump({"losses": seen}, f)
