"""What crosses a process boundary, one module per format, for both sides (the launcher's and the ranks'):

    agent_frames.py      frames on the channel between the launcher and a host's agent (also the ranks'
                         control channels'), and the beat
    agent_messages.py    the typed JSON payloads of those frames (AgentJob, ExitReport, DumpRequest, ...)
    control_protocol.py  an elastic rank's control channel to its host's owner (commit, notify, reset)
    shm_slot.py          the committed-state segment in /dev/shm: two slots, so a torn write never wins
    spare_handoff.py     what the owner of a warm spare tells it to become a rank (argv, env, fds)
    runfunc_lines.py     trainrun.run's call to the ranks and each rank's outcome back, as marked lines
    perf_line.py         a rank's window summary of its collectives, for straggler detection

Each module is stdlib only (numpy/xxhash where a format needs them) and imports nothing of the launcher's
or the ranks' side above it: both sides import these, so a format is read and written in one place.
"""
