"""Triton kernels for bitsandbytes weights at decode-sized batches (``triton_ops``).

They register for CUDA, above the ops' bitsandbytes-backed references (which the bnb quant plugin
registers for every device), under the same names:

- ``bnb_4bit_matmul(x, packed, quant_state, bias)``: NF4/FP4, plain or double-quantized absmax;
- ``bnb_int8_matmul(x, data, scb, threshold, bias)``: weight-only int8 (no activation rounding,
  no outlier search), so it is capturable in a CUDA graph whatever the threshold.

Each declines (``supports``) calls of more than ``SMALL_BATCH_MAX_TOKENS`` tokens, float32
activations and layouts it does not handle; bitsandbytes then runs the call.
"""
from __future__ import annotations

from ...core.hookspecs import hookimpl
from ..triton_support import lazy_ops

# Tokens per call up to which the Triton kernels take bitsandbytes matmuls (decode batches). The
# bnb-int8 scheme tells the engine to capture CUDA graphs only up to this many tokens per step
# when its outlier threshold is on (larger steps run bitsandbytes' LLM.int8, which syncs).
SMALL_BATCH_MAX_TOKENS = 16


TRITON_OPS = ("bnb_4bit_matmul", "bnb_4bit_matmul_segments", "bnb_int8_matmul")  # triton_ops.OPS


def register_all(register) -> None:
    for name, fn in lazy_ops(f"{__name__}.triton_ops", TRITON_OPS, "bitsandbytes Triton kernels").items():
        register(name, fn, device="cuda", priority=10)


@hookimpl
def register_kernels(register):
    register_all(register)


__all__ = ["SMALL_BATCH_MAX_TOKENS", "register_all"]
