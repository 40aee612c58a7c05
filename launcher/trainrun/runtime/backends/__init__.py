"""Data-plane backends: the primitives the engine's collectives are built from (mpi.py; nccl.py for CUDA)."""
