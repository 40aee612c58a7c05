"""The cost of a graph collective's nodes alone, in one process without MPI (issue 29): tf.function of one
numpy_function (a graph collective before the asynchronous ops), of two chained numpy_functions, and of
numpy_function -> TrainrunWait -> numpy_function (a lone graph collective now). min / median of 400
interleaved calls of each.

    python scripts/bench_tf_graph_nodes.py
"""
import statistics
import time

import numpy as np
import tensorflow as tf

tf.config.threading.set_inter_op_parallelism_threads(2)
from trainrun.tensorflow import native  # noqa: E402

wait, release = native.wait_op()
x = tf.constant(np.ones(1024, np.float32))
ids = iter(range(1, 10**9))


def submit(a):
    t = next(ids)
    release(t)
    return np.int64(t)


def chain(v):
    tid = tf.numpy_function(submit, [v], tf.int64, stateful=True)
    tid = wait(tf.reshape(tid, []))
    return tf.numpy_function(lambda t, a: a, [tid, v], tf.float32, stateful=True)


def main():
    one = tf.function(lambda v: tf.numpy_function(lambda a: a, [v], tf.float32, stateful=True))
    two = tf.function(lambda v: tf.numpy_function(
        lambda a: a, [tf.numpy_function(lambda a: a, [v], tf.float32, stateful=True)], tf.float32, stateful=True))
    fns = {"1 numpy_function": one, "2 numpy_functions": two, "submit+wait+finish": tf.function(chain)}
    for f in fns.values():
        f(x)
    times = {k: [] for k in fns}
    for _ in range(400):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f(x)
            times[k].append(time.perf_counter() - t0)
    for k, ts in times.items():
        print(f"{k}: min {min(ts) * 1e6:.0f} us, median {statistics.median(ts) * 1e6:.0f} us")


if __name__ == "__main__":
    main()
