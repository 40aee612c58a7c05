"""trainrun: a launcher and Horovod-compatible allreduce runtime for distributed training.

Importing this package must stay cheap: the launcher's start-up path imports nothing heavy
(no paramiko, mpi4py, numpy or torch); docs/architecture.md has the map and the import rule.
"""

from trainrun.version import __version__  # noqa: F401  (the one place it is written: version.py)


def run(func, *args, **kwargs):
    """`trainrun.run(func, ...)`: run a function on N ranks and return their values (index = rank).

    The whole contract is trainrun.runfunc.api.run's; it is imported at the first call, so that
    `import trainrun` stays cheap."""
    from trainrun.runfunc.api import run as _run

    return _run(func, *args, **kwargs)


def __getattr__(name: str):
    """trainrun.run's errors (RankError, RunError), imported when first used."""
    if name in ("RankError", "RunError"):
        from trainrun.runfunc import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'trainrun' has no attribute {name!r}")
