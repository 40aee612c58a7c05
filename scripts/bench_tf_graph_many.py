"""Graph collectives' cost (issue 29): a tf.function with one 4 KiB allreduce, and one TF1 session.run with
64 independent 4 KiB allreduces; minimum and median per call on rank 0, every call after a barrier.

    trainrun -np 2 python scripts/bench_tf_graph_many.py [--inter-op N] [--iters K]

--inter-op sets the TF1 session's inter-op threads (default 32: code from before the asynchronous
graph ops hangs in the 64-allreduce step with fewer threads than collectives; to compare, run this
script with PYTHONPATH pointing at that code's launcher/).
"""
import argparse
import statistics
import time

import numpy as np
import tensorflow as tf
from mpi4py import MPI

import trainrun.tensorflow as hvd

COMM = MPI.COMM_WORLD


def min_median_us(fn, iters: int) -> tuple[float, float]:
    times = []
    for _ in range(iters):
        COMM.Barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e6, statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inter-op", type=int, default=32, help="the TF1 session's inter-op threads")
    parser.add_argument("--iters", type=int, default=40, help="calls of the 64-allreduce step (x5 for the lone one)")
    args = parser.parse_args()
    hvd.init()
    x = tf.ones([1024])
    one = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, name="one"))
    one(x)
    lone = min_median_us(lambda: one(x), 5 * args.iters)
    graph = tf.Graph()
    with graph.as_default():
        phs = [tf.compat.v1.placeholder(tf.float32, [1024]) for _ in range(64)]
        outs = [hvd.allreduce(p, op=hvd.Sum, name=f"many.{i}") for i, p in enumerate(phs)]
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=args.inter_op)
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        feed = {p: np.ones(1024, np.float32) for p in phs}
        sess.run(outs, feed)
        many = min_median_us(lambda: sess.run(outs, feed), args.iters)
    if hvd.rank() == 0:
        print(f"tf.function, 1 x 4 KiB allreduce: min {lone[0]:.0f} us, median {lone[1]:.0f} us")
        print(f"TF1 session.run, 64 x 4 KiB allreduces ({args.inter_op} inter-op threads): "
              f"min {many[0]:.0f} us, median {many[1]:.0f} us", flush=True)


if __name__ == "__main__":
    main()
