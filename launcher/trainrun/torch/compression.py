"""Gradient compression for the wire, as horovod.torch.compression (`Compression.none`, `Compression.fp16`)."""
from __future__ import annotations

import torch

from trainrun.runtime.compression import Compressor, NoneCompressor

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 and come back in their own dtype."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.type(ctx) if ctx.is_floating_point else tensor


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
