"""The per-host agent and the framed channel it speaks.

`python -m trainrun.agent` (service.py) runs on every remote host, started by a fan-out engine
(trainrun.fanout): it reports the host's facts, starts that host's ranks with the same LocalRanks the
launcher uses for its own host, and relays output, exits and PMI lines as frames until its
ranks end or its channel closes (the frames: trainrun/wire/agent_frames.py). Nothing here opens a network port.
"""
