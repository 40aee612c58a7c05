"""The straggler measurement of one engine: plain counters that the engine's parts bump and the diag
thread reads (wire/perf_line.py, once per window, without locks); the torch optimizer adds its steps.

A perf_counter_ns pair per blocking wait and a few int operations per round; `on` False (the
TRAINRUN_STRAGGLER=0 setting, which the engine is given at construction, or a benchmark's A/B) stops the
timing, not the step count.
"""
from __future__ import annotations


class Meter:
    __slots__ = ("on", "wait_ns", "waits", "collectives", "last", "steps", "step_end", "before_ns", "reduced_bytes")

    def __init__(self, on: bool):
        self.on = on
        self.wait_ns = 0        # time user threads spent blocked in this engine's collectives
        self.waits = 0          # blocking waits (wait_all, lone ops)
        self.collectives = 0    # cached ops run (each op of a fused batch counts)
        self.last = 0           # of those, ops whose round this rank was the last to join (ties count)
        self.steps = 0          # optimizer steps (torch DistributedOptimizer.synchronize)
        self.step_end = 0       # perf_counter_ns when the last step's synchronize ended, until backward begins
        self.before_ns = 0      # time from a step's end to the next backward's first gradient (loader, forward)
        self.reduced_bytes = 0  # allreduce payload (inputs' bytes): the monitor's throughput
