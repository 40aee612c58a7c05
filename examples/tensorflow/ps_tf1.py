"""TensorFlow 1 between-graph replication (tf.train.ClusterSpec, tf.distribute.Server, replica_device_setter,
MonitoredTrainingSession), launched by trainrun:

    trainrun -np 3 --tf-cluster ps=1 python ps_tf1.py      # the chief and 1 worker train, 1 ps holds the variables

One file for every task, branching on its job name as TensorFlow 1's distributed guide does; the cluster and
this task come from TF_CONFIG (trainrun sets it). In TF1 terms the chief is worker 0 (is_chief): here it is the
`chief` job of the cluster. Every trainer builds its own graph, variables pinned to the ps by
replica_device_setter, and trains asynchronously until the shared global step reaches --target; the ps serves
(join()) until trainrun stops it when the chief has finished. Synthetic MNIST-shaped data, softmax regression.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic import mnist_like  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--target", type=int, default=200, help="global step to train to")
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--out", help="chief: write {'global_step': N, 'losses': [...]} here")
args = ap.parse_args()

v1 = tf.compat.v1
v1.disable_eager_execution()
tf_config = json.loads(os.environ["TF_CONFIG"])
cluster = tf.train.ClusterSpec(tf_config["cluster"])
job, index = tf_config["task"]["type"], tf_config["task"]["index"]
threads = v1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
server = tf.distribute.Server(cluster, job_name=job, task_index=index, config=threads)

if job == "ps":
    server.join()  # until trainrun stops it
    sys.exit(0)

is_chief = job == "chief"
images, labels = mnist_like(4096, seed=index + (0 if is_chief else 1))
x_all = images.reshape(-1, 784).astype("float32") / 255.0
with v1.device(v1.train.replica_device_setter(worker_device=f"/job:{job}/task:{index}", cluster=cluster)):
    global_step = v1.train.get_or_create_global_step()
    x = v1.placeholder(tf.float32, [None, 784])
    y = v1.placeholder(tf.int64, [None])
    w = v1.get_variable("w", [784, 10], initializer=v1.zeros_initializer())
    b = v1.get_variable("b", [10], initializer=v1.zeros_initializer())
    loss = v1.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=tf.matmul(x, w) + b))
    train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=global_step)
    with v1.control_dependencies([train_op]):
        step_after = v1.identity(global_step)  # the global step this update made (read after it)

# each trainer talks to the ps and itself only (not waiting on the other trainers)
session_config = v1.ConfigProto(device_filters=["/job:ps", f"/job:{job}/task:{index}"],
                                inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
losses, step, i = [], 0, 0


class LastGlobalStep(v1.train.SessionRunHook):
    """The global step read after each run, after StopAtStepHook's: the other trainers may have made the last
    updates, so the step this trainer's own update saw (step_after) can be below the step training stopped at."""
    value = 0

    def after_run(self, run_context, run_values):
        self.value = int(run_context.session.run(global_step))


last = LastGlobalStep()
hooks = [v1.train.StopAtStepHook(last_step=args.target), last]
with v1.train.MonitoredTrainingSession(master=server.target, is_chief=is_chief, hooks=hooks, config=session_config,
                                       checkpoint_dir=None, save_summaries_steps=None, log_step_count_steps=0) as sess:
    while not sess.should_stop():
        lo = (i * args.batch) % (len(x_all) - args.batch)
        _, value, step = sess.run([train_op, loss, step_after], {x: x_all[lo:lo + args.batch], y: labels[lo:lo + args.batch]})
        losses.append(float(value))
        i += 1
step = max(step, last.value)
print(f"{job} {index}: {i} local steps, global step {step}, loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
if args.out and is_chief:
    with open(args.out, "w") as f:
        json.dump({"global_step": int(step), "losses": losses}, f)
