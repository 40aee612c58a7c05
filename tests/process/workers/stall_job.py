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
  absent HOW R  rank R stays alive but never joins allreduce 'x', which the others wait in: HOW is
                `spin` (a busy loop), `sleep`, `io` (a read from a pipe nobody writes) or `loader`
                (a torch DataLoader whose worker is deadlocked in Queue.get); rank R writes
                DIR/absent.R (with its loader worker's pid as the record's grandchild) first
"""
import json
import os
import sys
import time

import numpy as np

import trainrun.numpy as hvd

directory, mode = sys.argv[1], sys.argv[2]


def record(name="pid", grandchild=None):
    tmp = os.path.join(directory, f".tmp.{hvd.rank()}")
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "grandchild": grandchild}, f)
    os.rename(tmp, os.path.join(directory, f"{name}.{hvd.rank()}"))


class Deadlocked:
    """A dataset whose every item waits on a queue nobody fills (a DataLoader worker deadlocked)."""

    def __init__(self):
        import multiprocessing

        self.queue = multiprocessing.get_context("fork").Queue()

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return self.queue.get()


def stay_absent(how):
    if how == "spin":
        record("absent")
        while True:
            pass
    if how == "sleep":
        record("absent")
        while True:
            time.sleep(60)
    if how == "io":
        r, _w = os.pipe()
        record("absent")
        os.read(r, 1)
    if how == "loader":
        batches = iter(torch.utils.data.DataLoader(Deadlocked(), num_workers=1, timeout=0))
        record("absent", grandchild=batches._workers[0].pid)
        next(batches)
    raise SystemExit(f"unknown HOW {how!r}")


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


if sys.argv[2:4] == ["absent", "loader"]:
    import torch.utils.data  # (before init: the absence starts at the loader, not in a slow import)
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
elif mode == "absent":
    if hvd.rank() == int(sys.argv[4]):
        stay_absent(sys.argv[3])
    hvd.allreduce(np.ones(4), name="x")  # fails with a StallError: the absent rank never submits
    print("x completed", flush=True)
elif mode == "loop":
    x = np.ones(1000, dtype=np.float32)
    while True:
        hvd.allreduce(x, name="step")
