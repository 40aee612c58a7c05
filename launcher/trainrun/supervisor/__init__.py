"""The launcher's supervision of a running job (the ranks' own runtime is trainrun.runtime):
the RankGroup and RankEvents seams (groups.py), ranks started on this machine
(local.py: LocalRanks), the supervisor that owns every group until the job ends (job.py: Job, with
fail-fast, signals, stacks on demand and teardown; result.py: JobResult and the first failure by time),
output (output.py; fold.py for --fold), `--mpi openmpi` (mpirun.py: mpirun as one rank group), what teardown sweeps (reaper.py: escaped processes; oom.py: the
OOM verdict), the watchdog that kills everything if the launcher dies (watchdog.py), how the Job judges its ranks' ends
(exit_policy.py), and the one constructor of a job's Job (assemble.py). Elastic jobs' own parts, which drive
this package, are trainrun/elasticjob/."""
