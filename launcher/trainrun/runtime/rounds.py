"""The agreement round's wire format: what every rank has ready, and what some rank has, in one call.

Every rank contributes one integer `v` = flags | mask << 64, where `mask` has bit c set for each op
of response-cache id c that the rank has ready but not yet run, and `flags` says what else it needs
(NEW: ops the cache does not know, to be announced; JOINED: this rank is in join(); ABORT: this rank
is stopping; PHASE: rank 0 wants a negotiation phase). It sends `v` and its complement `~v`, both
`words` 64-bit words long; one MPI_BAND allreduce over the pair yields AND(v) (ready on every rank)
and AND(~v) = ~OR(v) (flags and ops present somewhere). `words` grows with the cache, identically on
every rank, since every rank runs the same rounds in the same order.

Pure functions on Python ints: no per-op loops, whatever the number of ops in a round.
"""
from __future__ import annotations

NEW, JOINED, PHASE, ABORT = 1, 2, 4, 8
FLAG_BITS = 64  # the first word holds the flags; cache id c is bit FLAG_BITS + c
FLAG_MASK = (1 << FLAG_BITS) - 1


def words(cache_size: int) -> int:
    """64-bit words per contribution for a cache of `cache_size` entries (the flags word included)."""
    return 1 + (cache_size + 63) // 64


def encode(flags: int, mask: int, n_words: int) -> bytes:
    """The send buffer: v = flags | mask << 64, then ~v, little-endian, 2 * n_words 64-bit words."""
    bits = 64 * n_words
    v = flags | (mask << FLAG_BITS)
    return (v | ((~v & ((1 << bits) - 1)) << bits)).to_bytes(16 * n_words, "little")


def decode(buf, n_words: int) -> tuple[int, int]:
    """(AND of every rank's v, OR of every rank's v) from the reduced buffer."""
    bits = 64 * n_words
    r = int.from_bytes(buf, "little")
    full = (1 << bits) - 1
    return r & full, ~(r >> bits) & full


def ids(mask: int) -> list[int]:
    """The cache ids whose bits are set in `mask` (already shifted past the flags), ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out
