"""The engine's polling policy, in seconds (engine.py explains it).

A caller blocked in wait() has nothing better to do than poll; the background thread shares the
core with the training loop (gradient hooks fire during backward), so it yields the CPU sooner.
"""
WAITER_SPIN_S = 0.002      # a blocked caller spins this long after its last progress, then sleeps
BACKGROUND_SPIN_S = 0.0001  # the background thread yields the CPU this long after its last progress
MAX_SLEEP_S = 0.0002       # the longest sleep between polls
IDLE_S = 0.005             # an idle rank takes part in a round at least this often
