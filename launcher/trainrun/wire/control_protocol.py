"""The control channel between a rank and the agent of its host (or the launcher, for its own host).

Each rank of an elastic job inherits one end of a socketpair as TRAINRUN_CTL_FD (like PMI_FD: no port).
Frames are the agent channel's (wire/agent_frames.py: kind | rank | length | payload). Stdlib only: imported by
ranks (trainrun.elastic.client) and by the agent/launcher side (trainrun.elasticjob.control).

    rank -> owner   S  SEGMENT  u64 n: the path of this host's committed-state segment (shm_slot.py),
                                created or grown (keeping its newest copy) so that a slot holds n bytes;
                                n = 0: the current one, created nowhere   -> V  VALUE: the path (utf-8, may be
                                                                             empty) or X  ERROR: one line
    owner -> rank   U  UPDATE   JSON {"ts": float, "removed": bool}: the job's hosts changed; reset at the
                                next commit (pushed at any time; the client queues it)

The state itself never crosses the channel: the committing rank writes it into the segment, which the
owner created and keeps (it outlives the rank), and a rank of the next attempt reads it from there.

A copy's key is (attempt, count): the restart count of the attempt that committed and its commit count.
Keys order commits: a later attempt always resumed from the newest copy any host held, so its commits
supersede every earlier attempt's; within an attempt, the count orders them. NO_KEY: nothing held.
"""
from __future__ import annotations

import struct

SEGMENT, VALUE, ERROR, UPDATE = b"S", b"V", b"X", b"U"
SIZE_STRUCT = struct.Struct(">Q")
NO_KEY = (-1, -1)

# The exit code with which every rank of an elastic job leaves after HostsUpdatedInterrupt: "restart me on
# the new hosts" (EX_TEMPFAIL). The launcher honours it only after it has told the ranks of a host change.
RESET_EXIT_CODE = 75
