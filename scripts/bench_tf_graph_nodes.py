"""The cost of a lone graph collective's nodes alone, in one process without MPI (issue 29), as tf.function
calls on a 4 KiB float32 tensor, the collective itself an identity:

  before async    -- 1 numpy_function + TrainrunCheck (a graph collective before the asynchronous ops, 78cee20)
  wait+finish     -- submit numpy_function -> TrainrunWait -> finish numpy_function + TrainrunCheck, built
                     by hand (two Python crossings)
  now, lone op    -- graph_ops.collective as it is, its op alone in its graph: the submit node runs it to
                     completion and hands back (0, result); wait, finish and TrainrunCheck sit in the untaken
                     branch of a tf.cond on id == 0 (one Python crossing; design (2) of
                     docs/benchmarks/tensorflow.md)
  submit+cond     -- the same graph built by hand (the submit node a bare lambda), for the cost of the shape
  now, in flight  -- graph_ops.collective with the op left in flight (a second collective counted in its
                     graph), so the waiter thread completes it: the path of a graph of many collectives

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

wait, release = native.wait_op()
check = native.check_op()
x = tf.constant(np.ones(1024, np.float32))
ids = iter(range(1, 10**9))
OK, NO = np.int32(0), np.bytes_(b"")


def checked(outs):
    *outs, code, message = outs
    with tf.control_dependencies([check(code, message)]):
        return tf.identity(outs[0])


def before(v):
    return checked(tf.numpy_function(lambda a: [a, OK, NO], [v], [tf.float32, tf.int32, tf.string], stateful=True))


def submit(a):
    t = next(ids)
    release(t)
    return np.int64(t)


def wait_finish(v):
    tid = tf.numpy_function(submit, [v], tf.int64, stateful=True)
    tid = wait(tf.reshape(tid, []))
    return checked(tf.numpy_function(lambda t, a: [a, OK, NO], [tid, v], [tf.float32, tf.int32, tf.string],
                                     stateful=True))


def submit_cond(v):
    tid, out = tf.numpy_function(lambda a: [np.int64(0), a], [v], [tf.int64, tf.float32], stateful=True)
    tid = tf.reshape(tid, [])

    def later():  # never taken here (the op always completes in the submit node)
        t = wait(tid)
        return checked(tf.numpy_function(lambda t: [np.zeros(0, np.float32), OK, NO], [t],
                                         [tf.float32, tf.int32, tf.string], stateful=True))
    return tf.cond(tf.equal(tid, 0), lambda: tf.identity(out), later)


class _Started:
    """A runtime handle that is already complete, for the in-flight path without a runtime."""


def start(a, blocking=False):
    assert blocking  # the lone op: run to completion in the submit node
    return a


RESULTS = {}  # the in-flight variant's results, by handle id (its synchronize, stubbed in main)


def flight_start(a, blocking=False):
    handle = _Started()
    RESULTS[id(handle)] = a
    return handle, None


def now(v):
    return graph_ops.collective(start, lambda r: r, [v], tf.float32, "BenchNow")


def in_flight(v):
    count = graph_ops._COUNTS.setdefault(tf.compat.v1.get_default_graph(), [0])
    count[0] += 1  # a second collective counted in this graph: the submit leaves the op in flight
    return graph_ops.collective(flight_start, lambda r: r, [v], tf.float32, "BenchInFlight")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=1000)
    calls = ap.parse_args().calls
    # The in-flight variant's "handle" completes at once: synchronize and poll are stubbed for it.
    real_sync, real_poll = graph_ops.lifecycle.synchronize, graph_ops._polled

    def sync(h):
        return RESULTS.pop(id(h)) if id(h) in RESULTS else real_sync(h)
    graph_ops.lifecycle.synchronize = sync
    graph_ops._polled = lambda h: isinstance(h, _Started) or real_poll(h)
    fns = {"before async (1 crossing)": tf.function(before), "wait+finish (2 crossings)": tf.function(wait_finish),
           "now, lone op": tf.function(now), "submit+cond, by hand": tf.function(submit_cond),
           "now, in flight": tf.function(in_flight)}
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
