"""Running a plan: the RankGroup and RankEvents seams (groups.py), ranks started on this machine
(local.py: LocalRanks), the supervisor that owns every group until the job ends (job.py: Job, with
fail-fast, signals and teardown; result.py: JobResult), output (output.py) and the watchdog that kills
everything if the launcher dies (watchdog.py)."""
