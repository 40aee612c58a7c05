"""trainrun: a launcher and Horovod-compatible allreduce runtime for distributed training.

Importing this package must stay cheap: the launcher's start-up path imports nothing heavy
(no paramiko, mpi4py, numpy or torch); docs/architecture.md has the map and the import rule.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """`trainrun.run(func, ...)` (a function on N ranks, its return values back: trainrun.runfunc.api.run)
    and its errors, imported when first used, so `import trainrun` stays cheap. `trainrun.run` is the
    package trainrun/run/, which answers the call (the launcher's modules live there, and importing any of
    them binds the name to the package)."""
    if name == "run":
        import importlib

        return importlib.import_module("trainrun.run")
    if name in ("RankError", "RunError"):
        from trainrun.runfunc import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'trainrun' has no attribute {name!r}")
