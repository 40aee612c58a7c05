"""elastic_train.py without torch (starts in a fraction of the time): linear regression by SGD on the
framework-free runtime, its weights in a trainrun.elastic.ObjectState. Same environment and output."""
import hashlib
import os
import time

import numpy as np

import trainrun.elastic as elastic
import trainrun.runtime as hvd

STEPS = int(os.environ.get("STEPS", "40"))
COMMIT_EVERY = int(os.environ.get("COMMIT_EVERY", "5"))
PAUSE = float(os.environ.get("STEP_PAUSE", "0.05"))
FAIL_AT = os.environ.get("FAIL_AT", "")
BASE_LR = 0.01

hvd.init()
state = elastic.ObjectState(w=np.zeros(16), step=0, commits=0, lr=BASE_LR * hvd.size())


def on_reset():
    state.lr = BASE_LR * hvd.size()
    if hvd.rank() == 0:
        print(f"reset size {hvd.size()} lr {state.lr:g}", flush=True)


state.register_reset_callbacks([on_reset])


@elastic.run
def train(state):
    restart = elastic.restart_count()
    fail_rank, _, fail_step = FAIL_AT.partition(":")
    while state.step < STEPS:
        if FAIL_AT and restart == 0 and hvd.rank() == int(fail_rank) and state.step == int(fail_step):
            print(f"failing at step {state.step}", file=__import__("sys").stderr, flush=True)
            os._exit(3)
        rng = np.random.default_rng(state.step * 1000 + hvd.rank())
        x = rng.standard_normal((8, 16))
        grad = x.T @ (x @ state.w - x.sum(axis=1)) / 8
        state.w = state.w - state.lr * hvd.allreduce(grad, name="grad")
        state.step += 1
        if hvd.rank() == 0:
            print(f"step {state.step} size {hvd.size()} restart {restart}", flush=True)
        if state.step % COMMIT_EVERY == 0:
            state.commits += 1
            state.commit()
            if state.commits == 1 and hvd.rank() == 0:  # whether commit() left a host-update broadcast in flight
                print(f"host updates {os.environ.get('TRAINRUN_HOST_UPDATES')} check {state._pending is not None}",
                      flush=True)
        time.sleep(PAUSE)


train(state)
print(f"final step {state.step} sha {hashlib.sha256(state.w.tobytes()).hexdigest()[:16]} commits {state.commits}", flush=True)
