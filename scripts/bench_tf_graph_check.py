"""What Horovod's TF error types cost a graph collective: a tf.function allreduce (4 KiB, 1 rank) with the
TrainrunCheck node (trainrun.tensorflow.native) and without it (the pure-Python fallback), interleaved
rounds, medians and minimums per call; the eager allreduce beside them.

    trainrun -np 1 python scripts/bench_tf_graph_check.py
"""
import statistics
import time

import tensorflow as tf

import trainrun.tensorflow as hvd
from trainrun.tensorflow import native


def per_call_us(fn, arg, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(arg)
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    hvd.init()
    tf.config.threading.set_inter_op_parallelism_threads(1)
    kernel = native.check_op()
    x = tf.ones([1024])

    def traced():
        fn = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum))
        fn(x)  # traced now: with or without the check node, as native._loaded says
        return fn
    native._loaded = kernel
    with_check = traced()
    native._loaded = None
    without = traced()
    native._loaded = kernel
    times: dict = {"tf.function, with TrainrunCheck": [], "tf.function, without": [], "eager": []}
    for _ in range(30):
        times["tf.function, with TrainrunCheck"].append(per_call_us(with_check, x, 20))
        times["tf.function, without"].append(per_call_us(without, x, 20))
        times["eager"].append(per_call_us(lambda t: hvd.allreduce(t, op=hvd.Sum), x, 200))
    print("| call | median us | min us |\n|---|---:|---:|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} |")
    hvd.shutdown()


if __name__ == "__main__":
    main()
