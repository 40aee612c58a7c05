"""TensorFlow 2 parameter-server training (tf.distribute.ParameterServerStrategy + ClusterCoordinator, a custom
loop), launched by trainrun:

    trainrun -np 5 --tf-cluster ps=2 python ps_strategy.py      # 1 chief, 2 workers, 2 ps

Nothing here is trainrun's: one file for every task, branching on its task type as TensorFlow's tutorial does.
TF_CONFIG (set by trainrun for every task: the whole cluster on the job's network, this task's type and index)
is read by TFConfigClusterResolver. Workers and parameter servers start a tf.distribute.Server and serve until
they are stopped (trainrun stops them when the chief has finished); the chief builds the model, its variables
placed round robin on the parameter servers, and schedules training steps on the workers. A worker that dies is
tolerated: the coordinator runs its steps elsewhere, and the worker trainrun restarts joins again.

Synthetic MNIST-shaped data (synthetic.py); a small MLP with plain tf.Variables and SGD (no Keras).
Prints where each variable lives and the loss every few steps; `--out FILE` writes the losses as JSON.
"""
import argparse
import json
import os
import socket
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic import mnist_like  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40, help="training steps scheduled by the chief")
ap.add_argument("--batch", type=int, default=64, help="per step")
ap.add_argument("--lr", type=float, default=0.05)
ap.add_argument("--out", help="chief: write {'losses': [...], 'devices': {...}} here")
args = ap.parse_args()

tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
cluster = resolver.cluster_spec()


def wait_for(addresses, timeout=120.0):
    """Until every task of the cluster listens (the tasks start at the same time; the chief connects to all)."""
    deadline = time.monotonic() + timeout
    for address in addresses:
        host, port = address.rsplit(":", 1)
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


if resolver.task_type in ("worker", "ps"):
    server = tf.distribute.Server(cluster, job_name=resolver.task_type, task_index=resolver.task_id,
                                  protocol=resolver.rpc_layer or "grpc", start=True)
    print(f"{resolver.task_type} {resolver.task_id} serving at {server.target}", flush=True)
    server.join()  # until trainrun stops it
    sys.exit(0)
if resolver.task_type == "evaluator":
    print("evaluator: nothing to evaluate in this example", flush=True)
    sys.exit(0)

# the chief: the coordinator
wait_for(cluster.job_tasks("ps") + cluster.job_tasks("worker"))
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
images, labels = mnist_like(4096)

with strategy.scope():
    w1 = tf.Variable(tf.random.normal([784, 64], stddev=0.05, seed=1), name="w1")
    b1 = tf.Variable(tf.zeros([64]), name="b1")
    w2 = tf.Variable(tf.random.normal([64, 10], stddev=0.05, seed=2), name="w2")
    b2 = tf.Variable(tf.zeros([10]), name="b2")
variables = [w1, b1, w2, b2]
devices = {v.name.split(":")[0]: v.device for v in variables}
print("variables on " + ", ".join(f"{k} {d}" for k, d in devices.items()), flush=True)


def dataset_fn(_context=None):
    x = tf.cast(tf.reshape(images, [-1, 784]), tf.float32) / 255.0
    return tf.data.Dataset.from_tensor_slices((x, labels)).shuffle(4096, seed=0).repeat().batch(args.batch)


iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))


@tf.function
def train_step(it):
    def replica_fn(x, y):
        with tf.GradientTape() as tape:
            logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        for v, g in zip(variables, tape.gradient(loss, variables)):
            v.assign_sub(args.lr * g)
        return loss

    x, y = next(it)
    return strategy.run(replica_fn, args=(x, y))


results = []
for step in range(args.steps):
    results.append(coordinator.schedule(train_step, args=(iterator,)))
coordinator.join()
losses = [float(r.fetch()) for r in results]
for step in range(0, len(losses), 10):
    print(f"step {step}: loss {losses[step]:.4f}", flush=True)
print(f"chief: {len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
if args.out:
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "devices": devices}, f)
