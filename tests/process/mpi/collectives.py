"""Rank program: the basic MPI operations, each checked; prints one summary line."""
import numpy as np
from mpi4py import MPI

c = MPI.COMM_WORLD
r, n = c.rank, c.size
assert c.allreduce(r) == n * (n - 1) // 2
a = np.full(16 << 20, r + 1.0, dtype=np.float32)  # 64 MiB
b = np.empty_like(a)
c.Allreduce(a, b)
assert b[0] == b[-1] == n * (n + 1) / 2
assert c.bcast({"x": r} if r == 0 else None, root=0) == {"x": 0}
g = c.gather(r * 10, root=0)
assert g == ([i * 10 for i in range(n)] if r == 0 else None)
half = c.Split(r % 2, r)
assert half.size == (n + 1 - r % 2) // 2
c.Barrier()
shared = c.Split_type(MPI.COMM_TYPE_SHARED)
print("ok", n, r, shared.size, flush=True)
