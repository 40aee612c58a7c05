"""A Keras model on TensorFlow trained under hvd.elastic with TensorFlowKerasState (weights, the optimizer's
momentum and the step survive a restart through the host agents, no disk). Environment as elastic_numpy.py:
STEPS, COMMIT_EVERY, FAIL_AT=rank:step (rank exits 3 there in attempt 0)."""
import hashlib
import os
import sys

import numpy as np
import tensorflow as tf

import trainrun.tensorflow as hvd

STEPS = int(os.environ.get("STEPS", "12"))
COMMIT_EVERY = int(os.environ.get("COMMIT_EVERY", "5"))
FAIL_AT = os.environ.get("FAIL_AT", "")

hvd.init()
tf.random.set_seed(0)
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(4), tf.keras.layers.Dense(1)])
opt = tf.keras.optimizers.SGD(0.01, momentum=0.9)
state = hvd.elastic.TensorFlowKerasState(model, opt, step=0)


@hvd.elastic.run
def train(state):
    restart = hvd.elastic.restart_count()
    fail_rank, _, fail_step = FAIL_AT.partition(":")
    while state.step < STEPS:
        if FAIL_AT and restart == 0 and hvd.rank() == int(fail_rank) and state.step == int(fail_step):
            print(f"failing at step {state.step}", file=sys.stderr, flush=True)
            os._exit(3)
        rng = np.random.default_rng(state.step * 1000 + hvd.rank())
        x = rng.standard_normal((16, 8)).astype("float32")
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - x.sum(axis=1, keepdims=True)) ** 2)
        tape = hvd.DistributedGradientTape(tape)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        state.step += 1
        if hvd.rank() == 0:
            print(f"step {state.step} size {hvd.size()} restart {restart}", flush=True)
        if state.step % COMMIT_EVERY == 0:
            state.commit()


train(state)
weights = b"".join(w.tobytes() for w in model.get_weights() + [v.numpy() for v in opt.variables])
print(f"final step {state.step} sha {hashlib.sha256(weights).hexdigest()[:16]}", flush=True)
