"""Worker of tests/tensorflow/test_tf_buckets.py (run with TRAINRUN_BUCKET_BYTES=1 MiB): a tf.function
training step of 40 x Dense(128) (2.6 MB of gradients) through DistributedGradientTape reduces its gradients
in fused buckets (reduce.py: one TrainrunCollective node each), and the reduced gradients equal the eager
average of every rank's own. Writes rank<R>.json: {"nodes": N, "first_bucket_bytes": B} or {"error": "..."}.

argv: OUT_DIR
"""
import json
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

import trainrun.tensorflow as hvd
from trainrun.runtime import lifecycle
from trainrun.tensorflow import reduce


def main(out: Path) -> None:
    hvd.init()
    rank = hvd.rank()
    model = tf.keras.Sequential([tf.keras.Input((128,))] + [tf.keras.layers.Dense(128) for _ in range(40)])
    x = tf.constant(np.random.default_rng(rank).random((8, 128), np.float32))

    def grads(reduce_them):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x) ** 2) * 1e-3
        tape = hvd.DistributedGradientTape(tape) if reduce_them else tape
        return tape.gradient(loss, model.trainable_variables)

    step = tf.function(lambda: grads(True))
    reduced = [g.numpy() for g in step()]
    own = grads(False)
    want = [hvd.allreduce(g, op=hvd.Average, name=f"want.{i}").numpy() for i, g in enumerate(own)]
    for i, (g, w) in enumerate(zip(reduced, want)):
        if not np.allclose(g, w, rtol=1e-4, atol=1e-6):
            raise AssertionError(f"gradient {i}: {g.ravel()[:4]} != {w.ravel()[:4]}")
    graph = step.get_concrete_function().graph
    nodes = [op for op in graph.get_operations() if op.type == "TrainrunCollective"]
    first = reduce.buckets(list(range(len(own))), own, lifecycle.settings().bucket_bytes)[0]
    nbytes = sum(own[i].numpy().nbytes for i in first)
    (out / f"rank{rank}.json").write_text(json.dumps({"nodes": len(nodes), "first_bucket_bytes": nbytes}))


if __name__ == "__main__":
    out = Path(sys.argv[1])
    try:
        main(out)
    except Exception as e:  # noqa: BLE001 (reported to the test)
        (out / f"rank{hvd.rank()}.json").write_text(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        raise
