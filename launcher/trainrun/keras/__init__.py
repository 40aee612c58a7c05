"""Horovod's Keras API on trainrun: `import trainrun.keras as hvd` in a Horovod Keras script.

Keras 3 on whichever backend it runs: torch or tensorflow (JAX is not supported: its jit-compiled
steps would need the collectives as jax callbacks). The backend is Keras's own choice when Keras is
already imported or KERAS_BACKEND is set; otherwise this module sets KERAS_BACKEND to tensorflow if
TensorFlow is already imported, else to torch (trainrun's default since before TensorFlow support).
The collectives on Keras values are trainrun.keras_common.collectives' for the backend;
`DistributedOptimizer` averages gradients before Keras applies them, `callbacks` has Horovod's
broadcast, metric-average and warm-up callbacks, `load_model` restores a model with its optimizer
distributed again. For tf.keras (Keras 3 or tf-keras) use trainrun.tensorflow.keras.
"""
import os
import sys

if "keras" not in sys.modules and "KERAS_BACKEND" not in os.environ:
    os.environ["KERAS_BACKEND"] = "tensorflow" if "tensorflow" in sys.modules else "torch"

try:
    import keras  # noqa: E402
except ImportError as e:
    raise ImportError(f"trainrun.keras needs Keras 3 ({e}): pip install 'trainrun[keras]'") from e

if keras.backend.backend() not in ("torch", "tensorflow"):
    raise ImportError(f"trainrun.keras needs Keras 3 with the torch or tensorflow backend, not "
                      f"{keras.backend.backend()!r}: set KERAS_BACKEND before Keras is first imported")

from trainrun.keras import callbacks  # noqa: E402
from trainrun.keras.ops import (Compression, allgather, allreduce, broadcast, broadcast_variables,  # noqa: E402
                                reducescatter)
from trainrun.keras.optimizer import DistributedOptimizer, PartialDistributedOptimizer, load_model  # noqa: E402
from trainrun.runtime import allgather_object, barrier, broadcast_object, join  # noqa: E402
from trainrun.runtime.exceptions import HorovodInternalError, StallError, TensorMismatchError  # noqa: E402
from trainrun.runtime.ops import Average, Max, Min, Product, Sum  # noqa: E402
from trainrun.runtime.process_sets import ProcessSet, global_process_set  # noqa: E402
from trainrun.runtime.lifecycle import (add_process_set, cross_rank, cross_size, cuda_built, gloo_built,  # noqa: E402
                                    gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_size,
                                    mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, process_sets, rank,
                                    remove_process_set, rocm_built, shutdown, size, start_timeline, stop_timeline)


def ccl_built() -> bool:
    """False: trainrun has no oneCCL backend."""
    return False


def ddl_built() -> bool:
    """False: trainrun has no IBM DDL backend."""
    return False


def broadcast_global_variables(root_rank):
    """Keras 3 has no global variables: broadcast the model's through hvd.callbacks.BroadcastGlobalVariablesCallback
    (as Horovod's Keras examples do) or hvd.broadcast_variables(model.variables, root_rank)."""
    raise RuntimeError("hvd.broadcast_global_variables() needs TF1 global variables, which Keras 3 does not have; use "
                       "hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) or "
                       "hvd.broadcast_variables(model.variables, root_rank)")


def __getattr__(name):
    """`hvd.elastic`: Horovod's horovod.keras.elastic (KerasState and its callbacks) on the TensorFlow backend."""
    if name == "elastic":
        if keras.backend.backend() != "tensorflow":
            raise NotImplementedError("trainrun.keras.elastic needs Keras's tensorflow backend (KERAS_BACKEND=tensorflow); "
                                      "on torch use trainrun.torch.elastic.TorchState with the model and optimizer")
        import importlib

        return importlib.import_module("trainrun.tensorflow.keras.elastic")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [n for n in dir() if not n.startswith("_") and n not in ("os", "sys", "keras", "ops", "optimizer")]
