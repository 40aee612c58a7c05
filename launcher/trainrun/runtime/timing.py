"""The engine's polling policy, in seconds (engine.py explains it).

A caller blocked in wait() has nothing better to do than poll; the background thread shares the
core with the training loop (gradient hooks fire during backward), so it yields the CPU sooner.
"""
WAITER_SPIN_S = 0.002      # a blocked caller spins this long after its last progress, then sleeps
BACKGROUND_SPIN_S = 0.0001  # the background thread yields the CPU this long after its last progress
MAX_SLEEP_S = 0.0002       # the longest sleep between polls
IDLE_S = 0.05              # an idle rank takes part in a round at least this often: for phases (stall
                           # errors, abort) and liveness, whose limits are seconds; each idle round costs
                           # ~0.3 ms of CPU on a loaded 2-core host (the background thread's round with a
                           # peer that is computing), which every 5 ms was ~0.9 ms a step per rank taken
                           # from training (issue 40, docs/benchmarks/ceiling.md)
