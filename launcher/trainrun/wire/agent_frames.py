"""Frames on the one channel between the launcher and a host's agent (binary-safe, in order).

A frame is: kind (1 byte) | rank (int32, -1 when not about a rank) | length (uint32) | payload.

launcher -> agent:  JOB  (json: the host's ProcessSpecs)   SIGNAL (payload: signal number)
                    KILL                                  PMI    (rank: bytes for that rank's PMI socket)
                    DUMP (json DumpRequest: take the running ranks' stacks)
                    NOTIFY (json: the job's hosts changed; an elastic agent passes it to its ranks)
                    RESTART (rank: start that ended rank again; payload: its restart count; --tf-cluster)
both ways:          BEAT (every HEARTBEAT_EVERY s: "I am here"; silence is how a hung or cut-off peer shows;
                          json Beat: the sender's clock, and the agent echoes the launcher's at once,
                          so the launcher learns the agent's clock offset from the round trip)
agent -> launcher:  HELLO (json: host facts, sent at start)  STARTED (json: pids)
                    STDOUT / STDERR (rank: output bytes; empty = end of stream)
                    EXIT  (rank: json ExitReport: returncode, when, OOM verdict)
                    PMI    (rank: bytes the rank sent)
                    FATAL (text: the agent could not do its job, e.g. a program did not start)
                    STACKS (json DumpReply: the answer to DUMP)
                    PROGRESS (rank: its runtime made progress; payload: empty, or a window summary,
                              "WALL WAIT COLL LAST STEPS BEFORE BYTES RSS GPU": 9 fields, wire/perf_line.py)   STALL (rank: its runtime's "stall ..." or "stuck ..."
                                  line, runtime/rankhook.py: the job cannot go on)
                    DONE  (an elastic job's attempt is over here: ranks reaped, shm removed; a JOB may follow)
The JSON payloads' types are in messages.py.
"""
from __future__ import annotations

import json
import struct

HEADER = struct.Struct(">ciI")

JOB, SIGNAL, KILL, PMI, BEAT, DUMP = b"J", b"S", b"K", b"P", b"B", b"D"
HEARTBEAT_EVERY = 2.0
HELLO, STARTED, STDOUT, STDERR, EXIT, FATAL = b"H", b"R", b"O", b"E", b"X", b"F"
STACKS, PROGRESS, STALL = b"T", b"G", b"W"
NOTIFY, DONE = b"U", b"Q"  # elastic jobs only (every kind is one distinct byte, whatever its direction)
RESTART = b"A"  # parameter-server jobs only
STREAM_KIND = {1: STDOUT, 2: STDERR}
KIND_STREAM = {STDOUT: 1, STDERR: 2}


def frame(kind: bytes, rank: int = -1, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, rank, len(payload)) + payload


def json_frame(kind: bytes, doc) -> bytes:
    return frame(kind, -1, json.dumps(doc).encode())


class FrameReader:
    """Accumulates bytes, yields complete frames `(kind, rank, payload)`."""

    def __init__(self):
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, int, bytes]]:
        self._buf += data
        out = []
        while len(self._buf) >= HEADER.size:
            kind, rank, length = HEADER.unpack_from(self._buf)
            end = HEADER.size + length
            if len(self._buf) < end:
                break
            out.append((kind, rank, bytes(self._buf[HEADER.size:end])))
            del self._buf[:end]
        return out
