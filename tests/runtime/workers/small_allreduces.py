"""Rank side of test_persistent_requests.py's small-allreduce test: MPIBackend.allreduce over real MPI on 3 ranks,
through persistent requests (more keys than are kept, so the oldest are dropped and made again) and
through the nonblocking fallback; every result checked against NumPy."""
import sys

import numpy as np
from mpi4py import MPI

from trainrun.runtime.backends import mpi as B
from trainrun.runtime.ops import Max, Min, Product, Sum
from trainrun.runtime.waiting import Policy

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
REDUCE = {Sum: np.sum, Min: np.min, Max: np.max, Product: np.prod}


def mine(r, n, dtype, seed):
    return (np.arange(n) * (r + 1) + seed).astype(dtype) % 7 + 1  # small values: Product stays exact


for persistent in (True, False):
    policy = Policy()
    backend = B.MPIBackend(comm, lambda request, nbytes: policy.wait_request(request))
    backend._small._persistent = persistent  # the fallback, as with an MPI before 4.0 (every rank alike)
    cases = [(n, dtype, op) for n in (1, 3, 64, 1024, 2048) for dtype in (np.float32, np.float64, np.int32)
             for op in (Sum, Min, Max, Product)]
    assert len(cases) > B.SMALL_KEPT
    for rep in range(2):  # the second pass meets keys dropped in the first: made again, in step everywhere
        for seed, (n, dtype, op) in enumerate(cases):
            if np.dtype(dtype).itemsize * n > B.SMALL_MAX:
                continue
            want = REDUCE[op](np.stack([mine(r, n, dtype, seed) for r in range(size)]), axis=0).astype(dtype)
            got = mine(rank, n, dtype, seed)
            if seed % 2:  # in place
                backend.allreduce(None, got, op)
            else:  # out of place: the input is left as it was
                src = got.copy()
                out = np.empty_like(got)
                backend.allreduce(src, out, op)
                assert np.array_equal(src, got), "out of place wrote its input"
                got = out
            assert np.array_equal(got, want), (persistent, rep, n, dtype, op, got[:4], want[:4])
    kept = len(backend._small._kept)
    assert kept == (B.SMALL_KEPT if persistent else 0), (persistent, kept)
    big = np.full(B.SMALL_MAX // 4 + 1, rank + 1, np.float32)  # over the limit: a plain MPI_Iallreduce
    backend.allreduce(None, big, Sum)
    assert np.all(big == size * (size + 1) // 2)
    backend.close()  # frees the requests: MPICH warns at exit about any left
print(f"rank {rank}: small allreduces ok", file=sys.stderr)
