"""A rank for the tests of collectives that some rank never joins (tests/process/test_stalls.py).

After `DIR MODE`, every rank records its pid (DIR/pid.RANK, JSON like workers/job.py), does one
allreduce, then:

  leave HOW R [set]
                rank R leaves while the others wait in allreduce 'x', which they do not catch:
                HOW is `return` (its program ends), `exit0` / `exit1` (sys.exit), `caught` (it catches
                an exception and ends) or `os_exit0` (os._exit(0): no runtime shutdown at all); with
                `set`, ranks R and R+1 first use a process set of their own (R's exit-time shutdown of
                that set must not wait for R+1, which waits in 'x')
  loop          every rank runs allreduces of 1000 float32 named 'step' until it is killed (the test
                stops one of them with SIGSTOP)
"""
import json
import os
import sys

import numpy as np

import trainrun.numpy as hvd

directory, mode = sys.argv[1], sys.argv[2]


def record():
    tmp = os.path.join(directory, f".tmp.{hvd.rank()}")
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "grandchild": None}, f)
    os.rename(tmp, os.path.join(directory, f"pid.{hvd.rank()}"))


def leave(how):
    if how == "exit0":
        sys.exit(0)
    if how == "exit1":
        sys.exit(1)
    if how == "caught":
        try:
            raise ValueError("no more batches")
        except ValueError:
            print("caught it, leaving", flush=True)
    if how == "os_exit0":
        sys.stdout.flush()
        os._exit(0)


hvd.init()
hvd.allreduce(np.ones(4), name="warm-up")
record()
if mode == "leave":
    how, leaver = sys.argv[3], int(sys.argv[4])
    if sys.argv[5:] == ["set"]:
        pair = hvd.add_process_set([leaver, leaver + 1])
        if hvd.rank() in (leaver, leaver + 1):
            hvd.allreduce(np.ones(4), name="in-set", process_set=pair)
    if hvd.rank() == leaver:
        leave(how)
    else:
        hvd.allreduce(np.ones(4), name="x")  # never completes: the leaver does not take part
        print("x completed", flush=True)
elif mode == "loop":
    x = np.ones(1000, dtype=np.float32)
    while True:
        hvd.allreduce(x, name="step")
