"""The rank program of `--check --perf`'s collective step: `python -m trainrun.check.allreduce_bench SIZE...`.

Run by trainrun over the job's own plan (check/perf.py), so the MPI world is the one a job would get. For
each SIZE in bytes: an MPI allreduce (sum) of float32s, a warm-up, then a fixed number of iterations between
barriers. Rank 0 prints one line `TRAINRUN_PERF {"sizes": [{"size_bytes", "seconds", "busbw_mbps"}]}`, with
nccl-tests' bus bandwidth: 2 (n-1)/n * size / time.
"""
from __future__ import annotations

import json
import sys
import time


def iterations(size: int) -> int:
    """Fewer iterations for bigger buffers: about 32 MiB moved per size, 3 to 20 iterations."""
    return max(3, min(20, (32 << 20) // max(1, size)))


def main(argv: list[str]) -> int:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n, out = comm.Get_size(), []
    for size in map(int, argv):
        send: np.ndarray = np.ones(max(1, size // 4), dtype=np.float32)
        recv = np.empty_like(send)
        comm.Allreduce(send, recv, op=MPI.SUM)
        iters = iterations(size)
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            comm.Allreduce(send, recv, op=MPI.SUM)
        comm.Barrier()
        per = (time.perf_counter() - t0) / iters
        busbw = (2 * (n - 1) / n if n > 1 else 1.0) * send.nbytes * 8 / per / 1e6
        out.append({"size_bytes": int(send.nbytes), "seconds": per, "busbw_mbps": busbw})
    if comm.Get_rank() == 0:
        print("TRAINRUN_PERF " + json.dumps({"ranks": n, "sizes": out}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
