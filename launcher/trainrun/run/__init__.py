"""Running a plan: the RankGroup and RankEvents seams (groups.py), ranks started on this machine
(local.py: LocalRanks), the supervisor that owns every group until the job ends (job.py: Job, with
fail-fast, signals, stacks on demand and teardown; result.py: JobResult and the first failure by time),
output (output.py; fold.py for --fold), what teardown sweeps (reaper.py: escaped processes; oom.py: the
OOM verdict), the watchdog that kills everything if the launcher dies (watchdog.py), and elastic jobs
(elastic.py: the loop of attempts; elastic_policy.py: its pure decisions; attempt.py; control.py: the
ranks' control channels and committed state; discovery.py: the host discovery script)."""

import sys as _sys
import types as _types


class _CallablePackage(_types.ModuleType):
    """This package is also `trainrun.run(func, ...)`, the public API that runs a function on N ranks
    (trainrun.runfunc.api.run): the name is both, and Python binds `trainrun.run` to this package once any
    of its modules is imported, so the package itself must answer the call."""

    def __call__(self, func, *args, **kwargs):
        from trainrun.runfunc.api import run

        return run(func, *args, **kwargs)


_sys.modules[__name__].__class__ = _CallablePackage
