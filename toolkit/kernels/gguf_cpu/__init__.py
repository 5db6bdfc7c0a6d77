"""Compiled CPU kernels for packed GGUF weights (C++ with AVX2 paths, built on first use).

Registers, for ``device="cpu"``, ``gguf_matmul`` above the chunked torch path (priority 10 vs 5)
and ``gguf_dequantize`` above the reference. Both decline (``supports``) types they do not
decode and any call when the extension cannot be built; the registry then runs the torch
path. See ``ops.py`` for the algorithm and ``build.py`` for compilation and caching.
"""
from __future__ import annotations

from ...core.hookspecs import hookimpl
from .ops import HANDLED, gguf_dequantize_native, gguf_matmul_native

PRIORITY = 10


def register_all(register) -> None:
    register("gguf_matmul", gguf_matmul_native, device="cpu", priority=PRIORITY)
    register("gguf_dequantize", gguf_dequantize_native, device="cpu", priority=PRIORITY)


@hookimpl
def register_kernels(register):
    register_all(register)


__all__ = ["HANDLED", "PRIORITY", "gguf_dequantize_native", "gguf_matmul_native", "register_all"]
