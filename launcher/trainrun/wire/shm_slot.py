"""The committed-state segment: a file in /dev/shm with two slots, so that a writer killed mid-commit never
leaves a torn copy (the last complete commit wins). Stdlib (+ numpy for the copy, xxhash when installed).

The host's owner (the agent, or the launcher for its own host: elasticjob/control.py) creates the segment and
unlinks it; the rank that commits (local rank 0) maps it and writes; a rank of a later attempt maps it and
reads. The file outlives the writer: what a killed rank wrote stays.

Layout (little-endian):

    0       file header: MAGIC (8 bytes), version u32, pad u32, capacity u64 (bytes per slot)
    64      slot 0 header } SLOT: done u64, seq u64, attempt i64, count i64, length u64, algorithm u32,
    128     slot 1 header }       header crc u32, checksum u64 (of the payload's `length` bytes)
    4096    slot 0 payload (capacity bytes), then slot 1 payload

Writer contract (write()): pick the slot that does not hold the newest complete copy; set its `done` to 0
(the slot is now incomplete), copy the payload, write the other header fields, and write `done` = `seq`
last. A slot is complete when done == seq != 0, its header crc matches and its payload checksum matches.
A writer killed at any point leaves the other slot as it was: complete, and the newest. Readers look at a
segment only while no rank writes it (sync() at the start of an attempt; the writer is then dead or is the
reader), and a dead process's stores are all visible to the next reader, so no memory fence is needed
beyond program order. The checksum guards against what the ordering cannot (a stray write, a bug).

Order: a slot's copy is newer than another's when its key (attempt, count) is greater, then its seq.
Checksum: xxh3_64 (xxhash) when importable -- about a third of a memcpy's time --, else zlib.crc32 (about
3x a memcpy); the algorithm is in the header. The payload is hashed in pieces right after they are copied,
while they are still in cache.
"""
from __future__ import annotations

import mmap
import os
import struct
import zlib
from dataclasses import dataclass
from typing import Any

MAGIC = b"TRNSTAT1"
VERSION = 1
DATA_START = 4096
FILE_HEADER = struct.Struct("<8sIIQ")
SLOT = struct.Struct("<QQqqQIIQ")
SLOT_AT = (64, 128)
_HDR_FIELDS = struct.Struct("<QqqQIQ")   # what the header crc covers: seq, attempt, count, length, algorithm, checksum
PIECE = 1 << 20                          # copied, then hashed while in cache
CRC32, XXH3 = 1, 2
NO_KEY = (-1, -1)

# Test hook (tests/elastic/test_commit_shm.py): "stall:A:C" makes write() of key (A, C) stop for good between
# the payload and the header, so a test can SIGKILL the writer exactly there.
HOOK_ENV = "TRAINRUN_TEST_COMMIT_HOOK"
# read once, at import: a test hook of a module both sides use (the launcher's has no runtime settings);
# runtime/horovod_env.py lists it among the variables read outside its Settings
_HOOK = os.environ.get(HOOK_ENV)
_DONE_SEQ = struct.Struct("<QQ")


def _import_xxhash() -> Any:
    """The xxhash module, or None where it is not installed (zlib.crc32 then)."""
    try:
        import xxhash
    except ImportError:  # pragma: no cover - depends on the installation
        return None
    return xxhash


_xxhash = _import_xxhash()


class SegmentError(RuntimeError):
    """Not a committed-state segment, or too small for a payload."""


def best_algorithm() -> int:
    return XXH3 if _xxhash is not None else CRC32


class _Hasher:
    def __init__(self, algorithm: int):
        if algorithm == XXH3:
            if _xxhash is None:
                raise SegmentError("this copy was checksummed with xxh3 and the xxhash module is not installed here")
            self._h = _xxhash.xxh3_64()
        else:
            self._h, self._crc = None, 0

    def update(self, data) -> None:
        if self._h is not None:
            self._h.update(data)
        else:
            self._crc = zlib.crc32(data, self._crc)

    def value(self) -> int:
        return self._h.intdigest() if self._h is not None else self._crc


def checksum(data, algorithm: int) -> int:
    h = _Hasher(algorithm)
    view = memoryview(data).cast("B")
    for start in range(0, len(view), PIECE):
        h.update(view[start:start + PIECE])
    return h.value()


@dataclass(frozen=True)
class SlotHeader:
    done: int
    seq: int
    key: tuple[int, int]
    length: int
    algorithm: int
    hcrc: int
    checksum: int

    @staticmethod
    def header_crc(seq: int, key: tuple[int, int], length: int, algorithm: int, csum: int) -> int:
        return zlib.crc32(_HDR_FIELDS.pack(seq, key[0], key[1], length, algorithm, csum))

    @property
    def looks_complete(self) -> bool:
        """Header only: the payload checksum is checked by Segment.newest()."""
        return (self.done != 0 and self.done == self.seq
                and self.hcrc == self.header_crc(self.seq, self.key, self.length, self.algorithm, self.checksum))

    @property
    def order(self) -> tuple:
        return (self.key, self.seq)


def segment_size(capacity: int) -> int:
    return DATA_START + 2 * capacity


def round_capacity(nbytes: int) -> int:
    """Slot capacity for a payload of `nbytes`: whole pages, with room to grow by a quarter."""
    want = max(nbytes + nbytes // 4, 1 << 16)
    return (want + 4095) // 4096 * 4096


def create(path: str, capacity: int) -> None:
    """Create the segment file `path` with two empty slots of `capacity` bytes, its pages reserved
    (posix_fallocate: a full /dev/shm fails here with OSError(ENOSPC), not with SIGBUS in a rank's write)."""
    capacity = (capacity + 4095) // 4096 * 4096
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, segment_size(capacity))
        os.pwrite(fd, FILE_HEADER.pack(MAGIC, VERSION, 0, capacity), 0)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)


class Segment:
    """A mapped segment (read and write). `Segment(path)`; close() unmaps it (the file stays)."""

    def __init__(self, path: str, populate: bool = True):
        import numpy as np

        self.path = path
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < DATA_START:
                raise SegmentError(f"{path}: not a committed-state segment ({size} bytes)")
            flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
            self.mm = mmap.mmap(fd, size, flags=flags)
        finally:
            os.close(fd)
        magic, version, _pad, self.capacity = FILE_HEADER.unpack_from(self.mm, 0)
        if magic != MAGIC or version != VERSION or size < segment_size(self.capacity):
            self.mm.close()
            raise SegmentError(f"{path}: not a committed-state segment of version {VERSION}")
        self.buf = np.frombuffer(self.mm, dtype=np.uint8)
        self._wrote: tuple[int, int] | None = None  # (slot, seq) of this object's last write()

    def close(self) -> None:
        self.buf = None
        try:
            self.mm.close()
        except BufferError:  # a view of it is still alive somewhere: the mapping goes with it
            pass

    # reading
    def header(self, slot: int) -> SlotHeader:
        done, seq, attempt, count, length, algorithm, hcrc, csum = SLOT.unpack_from(self.mm, SLOT_AT[slot])
        return SlotHeader(done, seq, (attempt, count), length, algorithm, hcrc, csum)

    def payload(self, slot: int, length: int | None = None):
        """A numpy uint8 view of slot `slot`'s payload (valid while the segment is mapped and not rewritten)."""
        start = DATA_START + slot * self.capacity
        n = self.header(slot).length if length is None else length
        return self.buf[start:start + n]

    def _verified(self, slot: int) -> SlotHeader | None:
        h = self.header(slot)
        if not h.looks_complete or h.length > self.capacity:
            return None
        try:
            if checksum(self.payload(slot, h.length), h.algorithm) != h.checksum:
                return None
        except SegmentError:
            return None
        return h

    def newest(self, verify: bool = True) -> tuple[int, SlotHeader] | None:
        """(slot, header) of the newest complete copy, or None. verify=False trusts the headers."""
        found = []
        for slot in (0, 1):
            h = self._verified(slot) if verify else self.header(slot)
            if h is not None and h.looks_complete:
                found.append((h.order, slot, h))
        if not found:
            return None
        _, slot, h = max(found)
        return slot, h

    # writing
    def write(self, key: tuple[int, int], packed) -> SlotHeader:
        """Commit `packed` (packing.Packed, or any object with `.size` and `.write_into(dst, hasher)`) under
        `key` by the writer contract above; returns the new header. SegmentError if it does not fit."""
        if packed.size > self.capacity:
            raise SegmentError(f"a {packed.size}-byte state does not fit a {self.capacity}-byte slot")
        slot, seq = self._next_slot()
        at = SLOT_AT[slot]
        struct.pack_into("<Q", self.mm, at, 0)                   # done = 0: incomplete from here on
        self._wrote = None
        algorithm = best_algorithm()
        # xxh3's own object where there is one: its update() is called per MiB, without a wrapper's call
        hasher: Any = _xxhash.xxh3_64() if algorithm == XXH3 else _Hasher(algorithm)
        start = DATA_START + slot * self.capacity
        packed.write_into(self.buf[start:start + packed.size], hasher)
        csum = hasher.intdigest() if algorithm == XXH3 else hasher.value()
        if _HOOK is not None and _HOOK == f"stall:{key[0]}:{key[1]}":
            import sys
            import time

            print("trainrun test hook: commit payload written, header not yet", file=sys.stderr, flush=True)
            while True:
                time.sleep(60)
        hcrc = SlotHeader.header_crc(seq, key, packed.size, algorithm, csum)
        struct.pack_into("<QqqQIIQ", self.mm, at + 8, seq, key[0], key[1], packed.size, algorithm, hcrc, csum)
        struct.pack_into("<Q", self.mm, at, seq)                 # done = seq, last: complete
        self._wrote = (slot, seq)
        return SlotHeader(seq, seq, key, packed.size, algorithm, hcrc, csum)

    def _next_slot(self) -> tuple[int, int]:
        """(slot, seq) for the next write: the slot without the newest complete copy, and a seq above both.
        After this object's own write, when both slots' (done, seq) show that no one wrote since (two small
        reads), that is the other slot and seq + 1, without checking the header crcs again (this is on every
        commit's path)."""
        if self._wrote is not None:
            slot, seq = self._wrote
            mine, other = _DONE_SEQ.unpack_from(self.mm, SLOT_AT[slot]), _DONE_SEQ.unpack_from(self.mm, SLOT_AT[1 - slot])
            if mine == (seq, seq) and other[1] < seq:
                return 1 - slot, seq + 1
        newest = self.newest(verify=False)
        slot = 0 if newest is None else 1 - newest[0]
        return slot, 1 + max(self.header(0).seq, self.header(1).seq)

    def copy_newest_from(self, other: Segment) -> SlotHeader | None:
        """Copy `other`'s newest complete copy (checked) into slot 0 of this empty segment, header and all
        (growing a segment: elasticjob/control.py). Returns its header, or None when `other` held none."""
        found = other.newest()
        if found is None:
            return None
        slot, h = found
        if h.length > self.capacity:
            raise SegmentError(f"a {h.length}-byte copy does not fit a {self.capacity}-byte slot")
        self.payload(0, h.length)[:] = other.payload(slot, h.length)
        struct.pack_into("<QqqQIIQ", self.mm, SLOT_AT[0] + 8, h.seq, h.key[0], h.key[1], h.length, h.algorithm,
                         h.hcrc, h.checksum)
        struct.pack_into("<Q", self.mm, SLOT_AT[0], h.seq)
        return self.header(0)
