"""The agreement round's MPI side: one persistent bitwise-AND allreduce per contribution size.

Every operation costs a round (rounds.py), so its MPI call is on the latency path of every lone op.
A nonblocking MPI_Iallreduce builds its schedule afresh each call; a persistent one
(MPI_Allreduce_init, MPI 4) builds it once and each round is an MPI_Start on fixed buffers: on 2 ranks
a 32-byte round takes ~1.7 us instead of ~2.7 us. An MPI without MPI_Allreduce_init (before MPI 4)
gets the nonblocking call.

Ordering: MPI requires persistent collective initialisations, like nonblocking collectives, in the same
order on every rank of the communicator. A request is made lazily at the first round of a new size,
and every rank runs the same rounds in the same order with the same size (`words` grows identically
everywhere), so every rank makes it at the same point of the communicator's sequence. Only one round
is in flight at a time, so one send and one receive buffer per size suffice: a round's result is read
(decoded) before the next round of that size starts.
"""
from __future__ import annotations

from mpi4py import MPI

from trainrun.runtime.backends.mpi import allreduce_init


class RoundPort:
    def __init__(self, comm):
        """Rounds on `comm` (the engine's control communicator: rounds and phases only)."""
        self._comm = comm
        self._persistent = True  # until the MPI library says it has no MPI_Allreduce_init
        self._by_words: dict[int, tuple] = {}  # words -> (persistent request, send buffer, receive buffer)

    def start(self, send: bytes, words: int):
        """Start a round contributing `send` (rounds.encode, `words` long); returns (MPI request, the
        buffer its result lands in). The buffer is valid until the next round of this size starts."""
        entry = self._by_words.get(words)
        if entry is None:
            sbuf, rbuf = bytearray(16 * words), bytearray(16 * words)
            request = None
            if self._persistent:
                request = allreduce_init(self._comm, [sbuf, MPI.UINT64_T], [rbuf, MPI.UINT64_T], MPI.BAND)
                self._persistent = request is not None
            entry = self._by_words[words] = (request, sbuf, rbuf)
        request, sbuf, rbuf = entry
        if request is None:
            return self._comm.Iallreduce([send, MPI.UINT64_T], [rbuf, MPI.UINT64_T], op=MPI.BAND), rbuf
        sbuf[:] = send
        request.Start()
        return request, rbuf

    def close(self) -> None:
        """Free the requests (none may be in flight): before the communicator is freed."""
        for request, _, _ in self._by_words.values():
            if request is not None:
                request.Free()
        self._by_words.clear()
