"""Collectives on Keras values (tensors, variables, NumPy arrays) with Horovod's Keras signatures, on
the backend Keras runs: each returns a backend tensor; `broadcast_variables` assigns in place.
`binding` is the backend's module (trainrun.keras_common.torch_ops or tf_ops)."""
from __future__ import annotations

import keras

if keras.backend.backend() == "torch":
    from trainrun.keras_common import torch_ops as binding
else:
    from trainrun.keras_common import tf_ops as binding

Compression = binding.Compression
allreduce, allgather, broadcast = binding.allreduce, binding.allgather, binding.broadcast
reducescatter, broadcast_variables = binding.reducescatter, binding.broadcast_variables

__all__ = ["Compression", "allgather", "allreduce", "binding", "broadcast", "broadcast_variables", "reducescatter"]
