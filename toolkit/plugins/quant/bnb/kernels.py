"""Kernel-runtime ops backed by bitsandbytes, which itself dispatches to its CPU or CUDA backend.

``bnb_4bit_matmul(x, packed, quant_state, bias)`` and ``bnb_int8_matmul(x, data, scb, threshold, bias)``
compute ``x @ W.T (+ bias)`` exactly as bitsandbytes' ``Linear4bit`` / ``Linear8bitLt`` do, so
logits match transformers' bitsandbytes path. Registered for ``device="any"``; a faster
kernel (say, a fused Triton NF4 GEMM) can register for CUDA with a higher priority.

bitsandbytes is imported on the first call, not at registration (see the package docstring).
"""
from __future__ import annotations

import logging

import torch


class _DropFp16CastWarning(logging.Filter):
    """bitsandbytes logs a warning on *every* int8 matmul whose input is not fp16; the cast is by design."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "inputs will be cast from" not in record.getMessage()


logging.getLogger("bitsandbytes.autograd._functions").addFilter(_DropFp16CastWarning())


def bnb_4bit_matmul(x: torch.Tensor, packed: torch.Tensor, quant_state, bias: torch.Tensor | None = None):
    """``x @ dequantize_4bit(packed, quant_state).T + bias`` through ``bitsandbytes.matmul_4bit``.

    Weights whose rows cut quantization blocks take the same two steps (dequantize, then
    ``linear``, which is what bitsandbytes' CPU matmul does) through ``dequant.dequantize_4bit``,
    because bitsandbytes' AVX-512 kernel mis-scales them (see dequant.py).
    """
    import bitsandbytes as bnb  # noqa: PLC0415

    from .dequant import dequantize_4bit, needs_flat_view  # noqa: PLC0415

    if needs_flat_view(quant_state):
        return torch.nn.functional.linear(x, dequantize_4bit(packed, quant_state).to(x.dtype), bias)
    return bnb.matmul_4bit(x, packed.view(-1, 1), quant_state=quant_state, bias=bias)


def bnb_4bit_matmul_segments(x: torch.Tensor, packed: torch.Tensor, quant_states, bias: torch.Tensor | None = None):
    """``x @ W.T + bias`` for a fused projection: ``W`` the segments of ``quant_states`` stacked, ``packed``
    their bytes back to back; one ``bnb_4bit_matmul`` per segment, concatenated. (A CUDA kernel taking
    every segment in one launch registers above this one.)"""
    from toolkit.kernels import runtime  # noqa: PLC0415

    outs, start = [], 0
    for state in quant_states:
        size = int(state.shape[0]) * int(state.shape[1]) // 2
        outs.append(runtime.call("bnb_4bit_matmul", x, packed[start: start + size], state, None))
        start += size
    out = torch.cat(outs, -1)
    return out if bias is None else out + bias


def bnb_int8_matmul(x: torch.Tensor, data: torch.Tensor, scb: torch.Tensor, threshold: float,
                    bias: torch.Tensor | None = None):
    """LLM.int8 ``x @ (data * scb / 127).T + bias``, outlier columns above ``threshold`` in 16-bit."""
    import bitsandbytes as bnb  # noqa: PLC0415
    from bitsandbytes.autograd._functions import MatmulLtState  # noqa: PLC0415

    state = MatmulLtState()
    state.CB, state.SCB, state.threshold = data, scb, threshold
    state.has_fp16_weights, state.is_training = False, False
    return bnb.matmul(x, data, bias=bias, state=state)


def register_ops(register) -> None:
    register("bnb_4bit_matmul", bnb_4bit_matmul, device="any")
    register("bnb_4bit_matmul_segments", bnb_4bit_matmul_segments, device="any")
    register("bnb_int8_matmul", bnb_int8_matmul, device="any")
