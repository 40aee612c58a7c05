"""Gradient compression for the wire, as horovod.tensorflow.compression (`Compression.none`, `Compression.fp16`)."""
from __future__ import annotations

import tensorflow as tf


class Compressor:
    """compress(tensor) -> (tensor, ctx); decompress(tensor, ctx) -> tensor."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


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
