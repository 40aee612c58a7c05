"""Gradient compression for the wire, framework-free: Horovod's Compressor interface and the no-op
compressor. Each binding adds its FP16Compressor (the one cast that differs) and its `Compression`
namespace (`Compression.none`, `Compression.fp16`), as horovod.torch/horovod.tensorflow have them."""
from __future__ import annotations


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
