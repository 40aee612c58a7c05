"""Worker of tests/tensorflow/test_graph_ops_nodes.py (one process, no MPI): a graph's lone collective
takes its result from the submit node (no finish node runs), with autograph off in the node's Python,
and a failing lone op keeps its TF error type. Prints "ok" when every check passes."""
import numpy as np
import tensorflow as tf
from tensorflow.python.autograph.core import ag_ctx  # (no public "is autograph on here?")

from trainrun.runtime.exceptions import TensorMismatchError
from trainrun.tensorflow import graph_ops, native

if native.wait_op() is None:
    print("skip: trainrun's TensorFlow kernels cannot be built here (no C++ compiler?)")
    raise SystemExit(0)
takes = []
real_take = graph_ops.WAITER.take
graph_ops.WAITER.take = lambda tid: (takes.append(tid), real_take(tid))[1]
seen = []


def start(a, blocking=False):
    assert blocking, "a lone op runs to completion in its submit node"
    seen.append(ag_ctx.control_status_ctx().status)
    return a * 2


f = tf.function(lambda v: graph_ops.collective(start, lambda r: r + 1, [v], tf.float32, "TestLone"))
for _ in range(3):
    np.testing.assert_array_equal(f(tf.constant([1.0, 2.0])).numpy(), [3.0, 5.0])
assert takes == [], f"a finish node ran {len(takes)} times"
assert seen and all(s == ag_ctx.Status.DISABLED for s in seen), f"autograph status in the node: {seen}"


def failing(a, blocking=False):
    raise TensorMismatchError("rank 1 submitted shape [3]")


g = tf.function(lambda v: graph_ops.collective(failing, lambda r: r, [v], tf.float32, "TestLoneFails"))
try:
    g(tf.constant([1.0]))
    raise AssertionError("no error")
except tf.errors.FailedPreconditionError as e:
    assert "rank 1 submitted shape" in e.message, e.message
assert len(takes) == 1, takes  # the error went the in-flight way, to TrainrunCheck
print("ok")
