"""GGUF kernels: dequantize, dequantize-matmul and quantized embedding lookup for packed GGUF rows.

Ops (through ``toolkit.kernels.runtime.call``):

- ``gguf_dequantize(data, qtype, cols, dtype) -> [rows, cols]``
- ``gguf_matmul(x, data, qtype, cols) -> x @ W.T``
- ``gguf_embedding(ids, data, qtype, cols, dtype) -> [len(ids), cols]``
- ``gguf_int8_input(data, qtype, cols, tokens) -> Int8Input | None``: whether ``gguf_matmul`` reads
  activations rounded to int8 blocks (``kernels/int8_blocks.py``), which their producer may attach
- ``gguf_matmul_unreduced(x, data, qtype, cols) -> x @ W.T or SplitSums``: for a caller whose next op adds a
  split-K kernel's partial sums itself (``kernels/split_sums.py``)

The torch reference (``reference.py``) registers for every device; a chunked matmul (``cpu.py``)
takes over on CPU; Triton kernels register for CUDA when Triton is importable and decline, via
``supports``, the types they do not handle.
"""
from __future__ import annotations

from ...core.hookspecs import hookimpl
from ..triton_support import lazy_ops
from .cpu import gguf_matmul_chunked
from .reference import (SUPPORTED_TYPES, gguf_dequantize, gguf_embedding, gguf_int8_input, gguf_matmul,
                        gguf_matmul_unreduced, is_supported)
from .types import block_size, bytes_per_row, type_name, type_size

OPS = ("gguf_dequantize", "gguf_matmul", "gguf_embedding", "gguf_int8_input", "gguf_matmul_unreduced")


def register_all(register) -> None:
    """Register the reference ops and, where possible, the Triton ones (usable without pluggy)."""
    for name, fn in zip(OPS, (gguf_dequantize, gguf_matmul, gguf_embedding, gguf_int8_input, gguf_matmul_unreduced)):
        register(name, fn, device="any")
    register("gguf_matmul", gguf_matmul_chunked, device="cpu", priority=5)
    for name, fn in lazy_ops(f"{__name__}.triton_ops", OPS, "GGUF Triton kernels").items():
        register(name, fn, device="cuda", priority=10)


@hookimpl
def register_kernels(register):
    register_all(register)


__all__ = ["OPS", "SUPPORTED_TYPES", "block_size", "bytes_per_row", "gguf_dequantize", "gguf_embedding",
           "gguf_matmul", "is_supported", "register_all", "type_name", "type_size"]
