"""The launcher's supervision of a running job (the ranks' own runtime is trainrun.runtime):
the RankGroup and RankEvents seams (groups.py), ranks started on this machine
(local.py: LocalRanks), the supervisor that owns every group until the job ends (job.py: Job, with
fail-fast, signals, stacks on demand and teardown; result.py: JobResult and the first failure by time),
output (output.py; fold.py for --fold), `--mpi openmpi` (mpirun.py: mpirun as one rank group), what teardown sweeps (reaper.py: escaped processes; oom.py: the
OOM verdict), the watchdog that kills everything if the launcher dies (watchdog.py), and elastic jobs
(restarts.py: the loop of attempts, which reaches hosts and plans each attempt, so it sits in launch's layer,
not this package's: docs/architecture.md "Layers"; restart_policy.py: its pure decisions; attempt.py; control.py: the
ranks' control channels and committed state; discovery.py: the host discovery script)."""
