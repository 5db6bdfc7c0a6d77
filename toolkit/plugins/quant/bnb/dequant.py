"""bitsandbytes' 4-bit dequantization, routed around a CPU kernel that mis-scales unaligned rows.

A 4-bit weight is quantized as one flat run of ``blocksize``-element blocks, so a block may
straddle two rows when the row length is not a multiple of ``blocksize`` (tensor-parallel
slices re-quantized on their own, say [64, 32] with 64-element blocks). bitsandbytes 0.50's
AVX512 CPU ``dequantize_4bit`` picks each row's block scales as if blocks never straddled rows,
so on CPUs with AVX-512 those weights come back wrong (errors of the size of the weights),
while the portable kernel is right. Asking for the same bytes as a single row (shape
``[1, numel]``) gives every kernel the layout it handles, and the values are identical, because
quantization never looked at rows. Aligned weights go to bitsandbytes untouched.
"""
from __future__ import annotations

import copy
import math

import torch


def needs_flat_view(state) -> bool:
    """True where a CPU dequantization must go through the single-row view (see the module doc)."""
    return state.absmax.device.type == "cpu" and int(state.shape[-1]) % int(state.blocksize) != 0


def dequantize_4bit(packed: torch.Tensor, state) -> torch.Tensor:
    """``bitsandbytes.functional.dequantize_4bit(packed, state)``, exact on every CPU."""
    from bitsandbytes.functional import dequantize_4bit as bnb_dequantize_4bit  # noqa: PLC0415 - on use

    if not needs_flat_view(state):
        return bnb_dequantize_4bit(packed, state)
    shape = tuple(int(n) for n in state.shape)
    flat_state = copy.copy(state)
    flat_state.shape = torch.Size((1, math.prod(shape)))
    return bnb_dequantize_4bit(packed.reshape(-1, 1), flat_state).reshape(shape)

