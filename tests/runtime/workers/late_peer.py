"""Rank side of test_waiting.py: rank 0 waits in collectives for rank 1, which sleeps LATE_S first;
rank 0 measures the CPU time its whole process (all threads: the caller, the engine's background
thread) spends in each wait. Writes <out_dir>/rank<R>.json: {case: {"cpu_s", "wait_s", "error"}}."""
import json
import resource
import sys
import time
import traceback

import numpy as np

import trainrun.runtime as hvd

LATE_S = 2.0


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def blocking(x):
    """A blocking allreduce (the lone-op path, then the caller's own wait: rounds and the reduction)."""
    return hvd.allreduce(x, name="late.blocking", op=hvd.Sum)


def background(x):
    """An async allreduce polled without synchronizing: the engine's background thread drives it."""
    h = hvd.allreduce_async(x, name="late.async", op=hvd.Sum)
    while not hvd.poll(h):
        time.sleep(0.01)
    return hvd.synchronize(h)


def main() -> None:
    out_dir = sys.argv[1]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    results = {}
    for fn, n in ((blocking, 1024), (background, 256 << 10)):  # 4 KiB; 1 MiB (MPI_Iallreduce)
        x = np.full(n, rank + 1, np.float32)
        fn(x)  # the signature cached first, both ranks in step
        hvd.barrier()
        if rank != 0:
            time.sleep(LATE_S)
        c0, t0 = cpu_s(), time.monotonic()
        error = None
        try:
            got = fn(x)
            want = size * (size + 1) / 2
            assert got.shape == x.shape and np.all(got == want), f"wrong result: {got[:4]}... want {want}"
        except Exception:
            error = traceback.format_exc(limit=4)
        results[fn.__name__] = {"cpu_s": cpu_s() - c0, "wait_s": time.monotonic() - t0, "error": error}
        hvd.barrier()
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(results, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
