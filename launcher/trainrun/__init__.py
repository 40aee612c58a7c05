"""trainrun: a launcher and Horovod-compatible allreduce runtime for distributed training.

Importing this package must stay cheap: the launcher's start-up path imports nothing heavy
(no paramiko, mpi4py, numpy or torch); docs/architecture.md has the map and the import rule.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """`trainrun.run` (a function on N ranks, its return values back) and its errors, imported when first
    used, so `import trainrun` stays cheap."""
    if name in ("run", "RankError", "RunError"):
        from trainrun.runfunc import api

        return getattr(api, name)
    raise AttributeError(f"module 'trainrun' has no attribute {name!r}")
