"""A loop of plain blocking allreduces, no optimizer (the lone-op path): every rank sleeps STEP_S per
step, rank SLOW_RANK 0.1 s more. Runs SECONDS_TO_RUN; prints 'started' and 'done N'."""
import os
import time

import numpy as np

import trainrun.numpy as hvd

hvd.init()
slow = hvd.rank() == int(os.environ.get("SLOW_RANK", "-1"))
x = np.ones(1000, dtype=np.float32)
end = time.monotonic() + float(os.environ.get("SECONDS_TO_RUN", "30"))
print("started", flush=True)
steps = 0
while True:
    time.sleep(float(os.environ.get("STEP_S", "0.02")) + (0.1 if slow else 0.0))
    go = hvd.allreduce(np.array([1.0 if time.monotonic() < end else 0.0], dtype=np.float32), name="go", op=hvd.Min)
    if go[0] == 0:
        break
    hvd.allreduce(x, name="g")
    steps += 1
print(f"done {steps}", flush=True)
