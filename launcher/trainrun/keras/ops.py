"""Collectives on Keras values (tensors, variables, NumPy arrays) with Horovod's Keras signatures, on
the backend Keras runs: each returns a backend tensor; `broadcast_variables` assigns in place.
`binding` is the backend's trainrun.keras_common.collectives.KerasCollectives."""
from __future__ import annotations

import keras

from trainrun.keras_common.collectives import for_backend

binding = for_backend(keras.backend.backend())

Compression = binding.Compression
allreduce, allgather, broadcast = binding.allreduce, binding.allgather, binding.broadcast
reducescatter, broadcast_variables = binding.reducescatter, binding.broadcast_variables

__all__ = ["Compression", "allgather", "allreduce", "binding", "broadcast", "broadcast_variables", "reducescatter"]
