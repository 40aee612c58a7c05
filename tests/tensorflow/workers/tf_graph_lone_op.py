"""Worker of tests/tensorflow/test_graph_ops_nodes.py (one process, no MPI): a graph collective is one
native TrainrunCollective node (no numpy_function node in the graph), a lone one runs to completion in
the kernel's callback (`start(..., blocking=True)`), with autograph not converting its Python, its result is
written into the node's output (a result of another dtype is refused), and a failing one keeps its TF
error type. Prints "ok" when every check passes."""
import numpy as np
import tensorflow as tf
from tensorflow.python.autograph.core import ag_ctx  # (no public "is autograph on here?")

from trainrun.runtime.exceptions import TensorMismatchError
from trainrun.tensorflow import graph_ops, native

if native.load() is None:
    print("skip: trainrun's TensorFlow kernel cannot be built here (no C++ compiler?)")
    raise SystemExit(0)
seen = []


def start(a, blocking=False):
    assert blocking, "a lone op runs to completion in the kernel's callback"
    seen.append(ag_ctx.control_status_ctx().status)
    return a * 2


f = tf.function(lambda v: graph_ops.collective(start, lambda r: r + 1, [v], tf.float32, "TestLone"))
for _ in range(3):
    np.testing.assert_array_equal(f(tf.constant([1.0, 2.0])).numpy(), [3.0, 5.0])
assert seen and all(s != ag_ctx.Status.ENABLED for s in seen), f"autograph status in the node: {seen}"
ops = {op.type for op in f.get_concrete_function(tf.TensorSpec([2], tf.float32)).graph.get_operations()}
assert "TrainrunCollective" in ops and not ops & {"PyFunc", "EagerPyFunc", "PyFuncStateless"}, ops


def in_place(flat, blocking):
    assert blocking
    flat *= 3  # the runtime works in the node's own output buffer
    return None


g = tf.function(lambda a, b: graph_ops.collective(None, None, [a, b], [tf.float32, tf.float32], "TestInPlace",
                                                  in_place=in_place))
x, y = g(tf.constant([1.0, 2.0]), tf.constant([[3.0], [4.0], [5.0]]))
np.testing.assert_array_equal(x.numpy(), [3.0, 6.0])
np.testing.assert_array_equal(y.numpy(), [[9.0], [12.0], [15.0]])


def failing(a, blocking=False):
    raise TensorMismatchError("rank 1 submitted shape [3]")


h = tf.function(lambda v: graph_ops.collective(failing, lambda r: r, [v], tf.float32, "TestLoneFails"))
try:
    h(tf.constant([1.0]))
    raise AssertionError("no error")
except tf.errors.FailedPreconditionError as e:
    assert "rank 1 submitted shape" in e.message, e.message
wrong = tf.function(lambda v: graph_ops.collective(start, lambda r: r.astype(np.float64), [v], tf.float32,
                                                    "TestWrongDtype"))
try:  # a result of another dtype than the node's is refused, never written past TF's buffer
    wrong(tf.constant([1.0, 2.0]))
    raise AssertionError("no error")
except tf.errors.UnknownError as e:
    assert "float64" in e.message and "float32" in e.message, e.message
print("ok")
