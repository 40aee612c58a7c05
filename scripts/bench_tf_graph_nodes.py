"""The cost of a lone graph collective's node alone, in one process without MPI (issues 29 and 40), as
tf.function calls on a 4 KiB float32 tensor, the collective itself an identity:

  no collective     -- tf.function of `x + 0`: the floor (TF's own cost of calling a function)
  numpy_function    -- one stateful numpy_function node (the path of a graph collective before issue 40,
                       and today's fallback without the kernel)
  native, lone      -- graph_ops.collective as it is (TrainrunCollective, result form), its op alone in its
                       graph: the kernel's callback runs it to completion
  native, in place  -- the same in place (allreduce's form: the node's output buffer handed over)
  native, in flight -- the op left in flight (a second collective counted in its graph), completed by the
                       waiter thread: the path of a graph of many collectives

`--calls N` interleaved calls of each (default 1000); min and median of wall time, and median and mean of
the process CPU time per call (all threads; less sensitive to a loaded machine than wall time).

    PYTHONPATH=launcher python scripts/bench_tf_graph_nodes.py [--calls N]
"""
import argparse
import statistics
import time

import numpy as np
import tensorflow as tf

tf.config.threading.set_inter_op_parallelism_threads(2)
from trainrun.tensorflow import graph_ops, native  # noqa: E402

x = tf.constant(np.ones(1024, np.float32))


class _Started:
    """A runtime handle that is already complete, for the in-flight path without a runtime."""


def start(a, blocking=False):
    assert blocking  # the lone op: run to completion in the callback
    return a


def in_place(flat, blocking):
    assert blocking
    return None


RESULTS = {}  # the in-flight variant's results, by handle id (its synchronize, stubbed in main)


def flight_start(a, blocking=False):
    handle = _Started()
    RESULTS[id(handle)] = a.copy()
    return handle, None


def lone(v):
    return graph_ops.collective(start, lambda r: r, [v], tf.float32, "BenchLone")


def lone_in_place(v):
    return graph_ops.collective(None, None, [v], tf.float32, "BenchInPlace", in_place=in_place)


def in_flight(v):
    count = graph_ops._COUNTS.setdefault(tf.compat.v1.get_default_graph(), [0])
    count[0] += 1  # a second collective counted in this graph: the op is left in flight
    return graph_ops.collective(flight_start, lambda r: r, [v], tf.float32, "BenchInFlight")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=1000)
    calls = ap.parse_args().calls
    if native.load() is None:
        raise SystemExit("trainrun's TensorFlow kernel cannot be built here")
    # The in-flight variant's "handle" completes at once: synchronize and poll are stubbed for it.
    real_sync, real_poll = graph_ops.lifecycle.synchronize, graph_ops._polled

    def sync(h):
        return RESULTS.pop(id(h)) if id(h) in RESULTS else real_sync(h)
    graph_ops.lifecycle.synchronize = sync
    graph_ops._polled = lambda h: isinstance(h, _Started) or real_poll(h)
    fns = {"no collective (floor)": tf.function(lambda v: v + 0),
           "numpy_function": tf.function(lambda v: tf.numpy_function(lambda a: a, [v], tf.float32, stateful=True)),
           "native, lone": tf.function(lone), "native, in place": tf.function(lone_in_place),
           "native, in flight": tf.function(in_flight)}
    for f in fns.values():
        for _ in range(3):
            np.testing.assert_array_equal(f(x).numpy(), x.numpy())
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for _ in range(calls):
        for k, f in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            f(x)
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    print(f"{'nodes':28} {'wall min':>9} {'wall median':>12} {'CPU median':>11} {'CPU mean':>9}  (us, {calls} calls)")
    for k in fns:
        print(f"{k:28} {min(wall[k]) * 1e6:9.0f} {statistics.median(wall[k]) * 1e6:12.0f} "
              f"{statistics.median(cpu[k]) * 1e6:11.0f} {statistics.fmean(cpu[k]) * 1e6:9.0f}")


if __name__ == "__main__":
    main()
