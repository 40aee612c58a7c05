"""Horovod's Keras API on trainrun: `import trainrun.keras as hvd` in a Horovod Keras script.

Keras 3 with its torch backend (trainrun has no TensorFlow): importing this module sets
KERAS_BACKEND=torch unless it is set, and refuses another backend. Variables are torch tensors there,
so the collectives are trainrun.torch's; `DistributedOptimizer` (optimizer.py) averages gradients
before Keras applies them, `callbacks` has Horovod's broadcast, metric-average and warm-up callbacks.
"""
import os

os.environ.setdefault("KERAS_BACKEND", "torch")

try:
    import keras  # noqa: E402
except ImportError as e:
    raise ImportError(f"trainrun.keras needs Keras 3 ({e}): pip install 'trainrun[keras]'") from e

if keras.backend.backend() != "torch":
    raise ImportError(f"trainrun.keras needs Keras 3 with the torch backend, not {keras.backend.backend()!r}: "
                      "set KERAS_BACKEND=torch before Keras is first imported")

from trainrun.keras import callbacks  # noqa: E402
from trainrun.keras.ops import (allgather, allreduce, broadcast, broadcast_variables,  # noqa: E402
                                reducescatter)
from trainrun.keras.optimizer import DistributedOptimizer  # noqa: E402
from trainrun.runtime.exceptions import HorovodInternalError, StallError, TensorMismatchError  # noqa: E402
from trainrun.runtime.ops import Average, Max, Min, Product, Sum  # noqa: E402
from trainrun.runtime.process_sets import ProcessSet, global_process_set  # noqa: E402
from trainrun.runtime.state import (add_process_set, cross_rank, cross_size, init,  # noqa: E402
                                    is_homogeneous, is_initialized, local_rank, local_size, process_sets,
                                    rank, remove_process_set, shutdown, size)
from trainrun.torch import Compression, allgather_object, barrier, broadcast_object, join  # noqa: E402

__all__ = [n for n in dir() if not n.startswith("_") and n not in ("os", "keras", "ops", "optimizer")]
