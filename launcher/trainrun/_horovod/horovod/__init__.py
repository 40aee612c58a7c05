"""`horovod` for ranks that trainrun starts: each module re-exports trainrun's (trainrun/plan/horovod_shim.py
says when this package is on the path and how to get an installed Horovod instead).

    horovod.torch[.elastic]               trainrun.torch[.elastic]
    horovod.tensorflow[.elastic]          trainrun.tensorflow[.elastic]
    horovod.tensorflow.keras[.elastic]    trainrun.tensorflow.keras[.elastic]
    horovod.keras                         trainrun.keras (Keras 3)
    horovod.common.exceptions, .util, .process_sets, .elastic
"""
__version__ = "0.28.1"  # the Horovod API this shim answers to (trainrun's own version: trainrun.__version__)
__trainrun__ = "trainrun"


def __getattr__(name: str):
    """`horovod.run(func, ...)`: Horovod's signature over trainrun.run (trainrun.runfunc.horovod), where this
    trainrun has it."""
    if name == "run":
        import importlib

        try:
            return importlib.import_module("trainrun.runfunc.horovod").run
        except ModuleNotFoundError:
            pass
    raise AttributeError(f"module 'horovod' (trainrun's shim) has no attribute {name!r}")
