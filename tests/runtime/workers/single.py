"""Without mpiexec: errors before init, size 1 after it, init/shutdown/init again, timeline written."""
import json
import os
import sys

import numpy as np

import trainrun.runtime as hvd

timeline = sys.argv[1]
try:
    hvd.size()
except ValueError as e:
    assert "init" in str(e)
else:
    raise AssertionError("size() before init did not raise ValueError")
os.environ["TRAINRUN_TIMELINE"] = timeline
hvd.init()
assert (hvd.size(), hvd.rank(), hvd.local_size(), hvd.cross_size()) == (1, 0, 1, 1)
np.testing.assert_array_equal(hvd.allreduce(np.arange(3.0)), np.arange(3.0))
np.testing.assert_array_equal(hvd.allgather(np.arange(2)), np.arange(2))
hs = [hvd.allreduce_async(np.ones(4), name=f"tl.{i}") for i in range(5)]
for h in hs:
    hvd.synchronize(h)
hvd.shutdown()
events = json.load(open(timeline))["traceEvents"]
phases = {e["name"] for e in events if e["ph"] == "X"}
assert {"NEGOTIATE", "ALLREDUCE", "ALLGATHER"} <= phases, phases
assert any(e.get("args", {}).get("name") == "tl.3" for e in events)
del os.environ["TRAINRUN_TIMELINE"]
hvd.init()  # again, after shutdown
assert hvd.allreduce(np.ones(1), op=hvd.Sum)[0] == 1.0
hvd.shutdown()
print("single ok")
