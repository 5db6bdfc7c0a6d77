"""Fused mixture-of-experts over packed GGUF experts.

``gguf_fused_moe(x, gate_up, gate_up_qtype, down, down_qtype, topk_weights, topk_ids, activation)``:
``gate_up`` is uint8 ``[E * 2I, row_bytes]`` (each expert's gate rows then up rows, ``H`` columns),
``down`` uint8 ``[E * H, row_bytes]`` (``I`` columns): the GGUF tensors as the file stores them.
Returns ``[tokens, H]`` in ``x.dtype``.

The torch reference dequantizes one expert at a time (only experts some token chose), through
the GGUF reference dequantizer; it is the oracle for the CUDA kernel.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...core.hookspecs import hookimpl
from ..triton_support import lazy_ops
from ..gguf.reference import gguf_dequantize
from ..moe import expert_mixture, gated


def expert_shapes(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> tuple[int, int, int]:
    """(experts, hidden, intermediate) from the packed buffers' row counts."""
    hidden = x.shape[-1]
    experts = down.shape[0] // hidden
    return experts, hidden, gate_up.shape[0] // experts // 2


def gguf_fused_moe(x: torch.Tensor, gate_up: torch.Tensor, gate_up_qtype: int, down: torch.Tensor, down_qtype: int,
                   topk_weights: torch.Tensor, topk_ids: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    experts, hidden, inter = expert_shapes(x, gate_up, down)

    def expert_fn(expert: int, rows: torch.Tensor) -> torch.Tensor:
        w13 = gguf_dequantize(gate_up[expert * 2 * inter:(expert + 1) * 2 * inter], gate_up_qtype, hidden, x.dtype)
        w2 = gguf_dequantize(down[expert * hidden:(expert + 1) * hidden], down_qtype, inter, x.dtype)
        return F.linear(gated(F.linear(rows, w13), activation), w2)

    return expert_mixture(x, topk_weights, topk_ids, experts, expert_fn)


def gguf_moe_int8_input(gate_up: torch.Tensor, gate_up_qtype: int, hidden: int, routes: int) -> None:
    """What ``gguf_fused_moe`` reads besides x (``kernels/int8_blocks.py``): nothing here."""
    return None


@hookimpl
def register_kernels(register):
    register("gguf_fused_moe", gguf_fused_moe, device="any")
    register("gguf_moe_int8_input", gguf_moe_int8_input, device="any")
    for name, fn in lazy_ops(f"{__name__}.triton_moe", ("gguf_fused_moe", "gguf_moe_int8_input"),
                             "Triton fused MoE (GGUF experts)").items():
        register(name, fn, device="cuda", priority=10)
