"""Horovod's Keras API on trainrun: `import trainrun.keras as hvd` in a Horovod Keras script.

Keras 3 on whichever backend it runs: torch or tensorflow (JAX is not supported: its jit-compiled
steps would need the collectives as jax callbacks). The backend is Keras's own choice when Keras is
already imported or KERAS_BACKEND is set; otherwise this module sets KERAS_BACKEND to tensorflow if
TensorFlow is already imported, else to torch (trainrun's default since before TensorFlow support).
The collectives on Keras values are the backend's (trainrun._keras.torch_ops / tf_ops);
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
from trainrun.keras.optimizer import DistributedOptimizer, load_model  # noqa: E402
from trainrun.runtime import allgather_object, barrier, broadcast_object, join  # noqa: E402
from trainrun.runtime.exceptions import HorovodInternalError, StallError, TensorMismatchError  # noqa: E402
from trainrun.runtime.ops import Average, Max, Min, Product, Sum  # noqa: E402
from trainrun.runtime.process_sets import ProcessSet, global_process_set  # noqa: E402
from trainrun.runtime.state import (add_process_set, cross_rank, cross_size, init,  # noqa: E402
                                    is_homogeneous, is_initialized, local_rank, local_size, process_sets,
                                    rank, remove_process_set, shutdown, size)

__all__ = [n for n in dir() if not n.startswith("_") and n not in ("os", "sys", "keras", "ops", "optimizer")]
