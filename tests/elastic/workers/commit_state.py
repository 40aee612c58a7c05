"""A rank that commits a NumPy state every step (trainrun.elastic.ObjectState) and prints `step S restart R
w W` on rank 0; FAIL_STEP=S: every rank exits 3 at step S in every attempt (a job that fails for good)."""
import os
import time

import numpy as np

import trainrun.elastic as elastic
import trainrun.runtime as hvd

STEPS = int(os.environ.get("STEPS", "20"))
FAIL_STEP = int(os.environ.get("FAIL_STEP", "0"))
PAUSE = float(os.environ.get("STEP_PAUSE", "0.05"))

hvd.init()
state = elastic.ObjectState(w=np.zeros(1 << 16), step=0)


@elastic.run
def train(state):
    while state.step < STEPS:
        state.step += 1
        state.w = state.w + 1.0            # w == step everywhere: a resumed copy shows which commit it was
        if hvd.rank() == 0:
            print(f"step {state.step} restart {elastic.restart_count()} w {state.w[0]:g}", flush=True)
        if state.step == FAIL_STEP:
            os._exit(3)
        state.commit()
        time.sleep(PAUSE)


train(state)
print(f"final step {state.step} w {state.w[-1]:g}", flush=True)
