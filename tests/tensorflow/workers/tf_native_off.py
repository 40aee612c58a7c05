"""Graph collectives without trainrun's TensorFlow kernels (run by tests/tensorflow/test_graph_native_off.py
with TRAINRUN_TF_NATIVE=0): each collective is then one blocking numpy_function node (graph_ops.py). A
tf.function and a TF1 session each run allreduce (Sum, Average), allgather of uneven parts and broadcast,
with a few collectives in a chain (control dependencies: the fallback holds an inter-op thread per
collective, so independent ones beyond TF's threads could wait on each other, as documented). Writes
rank<R>.json: {"ok": true, "native": false} or {"error": "..."}.

argv: OUT_DIR
"""
import json
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

import trainrun.tensorflow as hvd
from trainrun.tensorflow import native


def expected(rank, size):
    base = np.arange(6, dtype=np.float32)
    every = [base + r for r in range(size)]
    return {"sum": sum(every), "avg": sum(every) / size,
            "gather": np.concatenate([np.full(r + 1, r, np.float32) for r in range(size)]),
            "bcast": base + (size - 1)}


def ops(x, part):
    """The collectives, each after the previous (control dependencies)."""
    out = {"sum": hvd.allreduce(x, op=hvd.Sum, name="off_sum")}
    with tf.control_dependencies([out["sum"]]):
        out["avg"] = hvd.allreduce(x, op=hvd.Average, name="off_avg")
    with tf.control_dependencies([out["avg"]]):
        out["gather"] = hvd.allgather(part, name="off_gather")
    with tf.control_dependencies([out["gather"]]):
        out["bcast"] = hvd.broadcast(x, root_rank=hvd.size() - 1, name="off_bcast")
    return out


def check(got, want, where):
    for key, ref in want.items():
        value = np.asarray(got[key])
        if value.shape != ref.shape or not np.allclose(value, ref):
            raise AssertionError(f"{where} {key}: {value.tolist()} != {ref.tolist()}")


def main(out_dir: Path) -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x = np.arange(6, dtype=np.float32) + rank
    part = np.full(rank + 1, rank, np.float32)
    want = expected(rank, size)
    try:
        if native.load() is not None:
            raise AssertionError("the native kernels loaded although TRAINRUN_TF_NATIVE=0")
        got = tf.function(ops)(tf.constant(x), tf.constant(part))
        check({k: v.numpy() for k, v in got.items()}, want, "tf.function")
        graph = tf.Graph()
        with graph.as_default():
            nodes = ops(tf.constant(x), tf.constant(part))
            with tf.compat.v1.Session(graph=graph) as sess:
                check(sess.run(nodes), want, "TF1 session")
        result = {"ok": True, "native": False}
    except Exception as e:  # noqa: BLE001 (reported to the test, which shows it)
        result = {"error": f"{type(e).__name__}: {e}"}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
