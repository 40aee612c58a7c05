"""The control channel between a rank and the agent of its host (or the launcher, for its own host).

Each rank of an elastic job inherits one end of a socketpair as TRAINRUN_CTL_FD (like PMI_FD: no port).
Frames are the agent channel's (agent/wire.py: kind | rank | length | payload). Stdlib only: imported by
ranks (trainrun.elastic.client) and by the agent/launcher side (trainrun.run.control).

    rank -> owner   C  COMMIT   key (2 x int64) + the serialized state    -> A  ACK (empty)
                    K  KEY      (empty)                                    -> V  VALUE: key only
                    G  GET      (empty)                                    -> V  VALUE: key + state bytes
    owner -> rank   U  UPDATE   JSON {"ts": float, "removed": bool}: the job's hosts changed; reset at the
                                next commit (pushed at any time; the client queues it)

A key is (attempt, count): the restart count of the attempt that committed and its commit count. Keys order
commits: a later attempt always resumed from the newest copy any host held, so its commits supersede every
earlier attempt's; within an attempt, the count orders them. NO_KEY: nothing held.
"""
from __future__ import annotations

import struct

COMMIT, KEY, GET, ACK, VALUE, UPDATE = b"C", b"K", b"G", b"A", b"V", b"U"
KEY_STRUCT = struct.Struct(">qq")
NO_KEY = (-1, -1)

# The exit code with which every rank of an elastic job leaves after HostsUpdatedInterrupt: "restart me on
# the new hosts" (EX_TEMPFAIL). The launcher honours it only after it has told the ranks of a host change.
RESET_EXIT_CODE = 75


def pack_key(key: tuple[int, int]) -> bytes:
    return KEY_STRUCT.pack(*key)


def unpack_key(data: bytes) -> tuple[int, int]:
    return tuple(KEY_STRUCT.unpack_from(data))  # type: ignore[return-value]
