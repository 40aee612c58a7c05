"""Rank side of test_persistent_requests.py's RoundPort test: real MPI rounds of changing sizes, with persistent
requests and with the nonblocking fallback; every rank checks AND/OR of what all ranks sent."""
import sys

from mpi4py import MPI

from trainrun.runtime import rounds
from trainrun.runtime.round_port import RoundPort

comm = MPI.COMM_WORLD.Dup()
rank, size = comm.rank, comm.size
for persistent in (True, False):
    port = RoundPort(comm)
    port._persistent = persistent  # the fallback path, as with an MPI before 4.0 (every rank alike)
    for step, n in enumerate([1, 2, 1, 3, 2, 1]):  # sizes change and come back: requests are reused
        ids = 64 * (n - 1)  # cache ids that fit: none with the flags word alone
        bit = (lambda i: 1 << (i % ids)) if ids else (lambda i: 0)
        common = bit(3 * step + 1)  # an op every rank has
        everyone = [bit(10 * r + step) for r in range(size)]  # ops only one rank has (when they differ)
        flags = rounds.NEW if rank == step % size else 0
        request, recv = port.start(rounds.encode(flags, common | everyone[rank], n), n)
        request.Wait()
        and_v, or_v = rounds.decode(recv, n)
        want_and = common | (everyone[0] if size == 1 else 0)
        want_or = common
        for m in everyone:
            want_or |= m
        assert and_v >> rounds.FLAG_BITS == want_and, (persistent, step, and_v, want_and)
        assert or_v >> rounds.FLAG_BITS == want_or, (persistent, step, or_v, want_or)
        assert or_v & rounds.FLAG_MASK == rounds.NEW and and_v & rounds.FLAG_MASK == (rounds.NEW if size == 1 else 0)
    made = [r for r, _, _ in port._by_words.values()]
    assert len(made) == 3 and all((r is not None) == persistent for r in made), (persistent, made)
    port.close()
comm.Free()
print(f"rank {rank}: round port ok", file=sys.stderr)
