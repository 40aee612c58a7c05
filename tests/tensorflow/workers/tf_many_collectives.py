"""Many independent collectives in one graph step (run by tests/tensorflow/test_graph_many_collectives.py).

argv: OUT_DIR MODE (tf1 | function). One TF1 `session.run`, or one `tf.function` call, holds 64
independent allreduces, 4 allgathers, 4 broadcasts and 2 alltoalls: more than TF's inter-op threads
(pinned to 2 here, as on a 2-core host). In TF1 each rank creates the collectives in its own order
(the executor's order follows it loosely), so ranks start them in different orders. A tf.function
runs stateful ops in program order (its automatic control dependencies), which must then be the same
on every rank, as for eager calls. Writes
rank<R>.json: {"ok": true} or {"error": "..."}, having checked every value against the reference.
"""
import json
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)

import trainrun.tensorflow as hvd  # noqa: E402

N_ALLREDUCE, N_GATHER, N_BCAST = 64, 4, 4


def build(xs, seed):
    """The collectives of one step, created in the order `seed` shuffles them to; results keyed by name."""
    rank = hvd.rank()
    order = list(range(N_ALLREDUCE))
    np.random.RandomState(seed).shuffle(order)
    out = {}
    for i in order:
        out[f"ar{i}"] = hvd.allreduce(xs[i], op=hvd.Sum, name=f"ar{i}")
    for i in range(N_GATHER):
        out[f"ag{i}"] = hvd.allgather(xs[i][: rank + 1], name=f"ag{i}")
        out[f"bc{i}"] = hvd.broadcast(xs[i], root_rank=i % hvd.size(), name=f"bc{i}")
    for i in range(2):
        out[f"a2a{i}"] = hvd.alltoall(tf.tile(xs[i][:1], [hvd.size()]), name=f"a2a{i}")
    return out


def inputs(rank):
    return [np.full(8, 100 * i + rank + 1, np.float32) for i in range(N_ALLREDUCE)]


def check(res, size):
    ranks = range(size)
    for i in range(N_ALLREDUCE):
        np.testing.assert_allclose(res[f"ar{i}"], np.full(8, sum(100 * i + r + 1 for r in ranks)), err_msg=f"ar{i}")
    for i in range(N_GATHER):
        want = np.concatenate([np.full(r + 1, 100 * i + r + 1) for r in ranks])
        np.testing.assert_allclose(res[f"ag{i}"], want, err_msg=f"ag{i}")
        np.testing.assert_allclose(res[f"bc{i}"], np.full(8, 100 * i + i % size + 1), err_msg=f"bc{i}")
    for i in range(2):
        np.testing.assert_allclose(res[f"a2a{i}"], [100 * i + r + 1 for r in ranks], err_msg=f"a2a{i}")


def mismatch_is_failed_precondition(mode, rank):
    """A shape that differs between ranks, in a step of several collectives (the asynchronous path):
    tf.errors.FailedPreconditionError with trainrun's message, as Horovod raises."""
    def step():
        good = hvd.allreduce(tf.ones([4]), name=f"good.{mode}")
        bad = hvd.allreduce(tf.ones([2 + rank]), name=f"bad.{mode}")
        return good, bad
    try:
        if mode == "tf1":
            with tf.compat.v1.Session(graph=tf.Graph()) as sess:
                with sess.graph.as_default():
                    fetches = step()
                sess.run(fetches)
        else:
            tf.function(step)()
    except tf.errors.FailedPreconditionError as e:
        assert "Mismatched shape" in str(e), str(e)
        return
    raise AssertionError("a shape mismatch in a graph of two collectives raised nothing")


def main():
    out_dir, mode = Path(sys.argv[1]), sys.argv[2]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    try:
        if mode == "tf1":
            tf.compat.v1.disable_eager_execution()
            phs = [tf.compat.v1.placeholder(tf.float32, [8]) for _ in range(N_ALLREDUCE)]
            fetches = build(phs, seed=rank)
            config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
            with tf.compat.v1.Session(config=config) as sess:
                for _ in range(3):  # a few steps: the same graph (and names) again
                    res = sess.run(fetches, feed_dict=dict(zip(phs, inputs(rank))))
                    check(res, size)
        else:
            step = tf.function(lambda xs: build(xs, seed=0))
            for _ in range(3):
                res = {k: v.numpy() for k, v in step([tf.constant(x) for x in inputs(rank)]).items()}
                check(res, size)
        mismatch_is_failed_precondition(mode, rank)
        result = {"ok": True}
    except Exception as e:  # noqa: BLE001 (reported to the test)
        result = {"error": f"{type(e).__name__}: {e}"[:2000]}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
