"""Gradient compression for the wire, as horovod.tensorflow.compression (`Compression.none`, `Compression.fp16`)."""
from __future__ import annotations

import tensorflow as tf

from trainrun.runtime.compression import Compressor, NoneCompressor

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 and come back in their own dtype."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tf.cast(tensor, ctx) if ctx is not None and ctx.is_floating else tensor


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
