"""HOROVOD_* tuning seen from inside a rank: init twice (the notes must still come once), 8 async allreduces of
distinct names, then what the engine ran with as one `TUNING {json}` line per rank; with `stall`, rank 1 then
sleeps while rank 0 allreduces alone, and rank 0 prints the StallError it gets."""
import json
import sys
import time

import numpy as np

import trainrun.runtime as hvd
from trainrun.runtime.lifecycle import engine

hvd.init()
hvd.shutdown()
hvd.init()
eng = engine()
before = eng.reductions
handles = [hvd.allreduce_async(np.full(256, i, np.float32), name=f"t{i}") for i in range(8)]
results = [hvd.synchronize(h) for h in handles]
assert all((r == i).all() for i, r in enumerate(results))
print("TUNING " + json.dumps({"rank": hvd.rank(), "threshold": eng.fusion_threshold, "capacity": eng.cache_capacity,
                              "reductions": eng.reductions - before, "cached": len(eng.cache.metas)}), flush=True)
if "stall" in sys.argv[1:]:
    if hvd.rank() == 0:
        try:
            hvd.allreduce(np.ones(4, np.float32), name="late")
        except hvd.StallError as e:
            print(f"STALL {e}", flush=True)
    else:
        time.sleep(4)  # back well before the launcher's verdict on the stall (supervisor/job.STALL_RECOVER_S)
