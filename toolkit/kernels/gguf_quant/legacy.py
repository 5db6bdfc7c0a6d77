"""The 32-element block types Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1.

Byte-identical to gguf-py's numpy quantizer (and GGML's reference): the same float32
operations in the same order, the same rounding (truncation after +0.5 / +8.5 / +16.5,
``roundf`` for Q8_0) and the same packing. Each encoder maps [n, 32] float32 blocks to
[n, type_size] uint8.
"""
from __future__ import annotations

import torch

from .bits import assemble, divide, fp16_bytes, pack_bits_lsb_first, pack_nibbles, round_half_away, safe_reciprocal


def q8_0(blocks: torch.Tensor) -> torch.Tensor:
    d = divide(blocks.abs().amax(-1, keepdim=True), 127)
    qs = round_half_away(blocks * safe_reciprocal(d)).to(torch.int8).view(torch.uint8)
    return assemble(fp16_bytes(d), qs)


def signed_max(blocks: torch.Tensor) -> torch.Tensor:
    """The element of largest magnitude, with its sign: numpy's ``take(argmax(abs))``, so on a tie
    between +m and -m (or an all-zero block, where the sign of the first zero shows) the first wins.
    The common case needs no argmax (slow over a short last dimension)."""
    magnitude = blocks.abs().amax(-1, keepdim=True)
    high, low = blocks.amax(-1, keepdim=True), blocks.amin(-1, keepdim=True)
    result = torch.where(high == magnitude, high, low)
    ambiguous = ((high == magnitude) & (low == -magnitude)).squeeze(-1)
    if bool(ambiguous.any()):
        rows = blocks[ambiguous]
        result[ambiguous] = rows.gather(-1, rows.abs().argmax(-1, keepdim=True))
    return result


def _codes(scaled: torch.Tensor, offset: float, top: int) -> torch.Tensor:
    """numpy's ``trunc(x + offset).astype(uint8).clip(0, top)``; x + offset >= 0 here, so the cast truncates."""
    return (scaled + offset).to(torch.uint8).clamp_(max=top)


def q4_0(blocks: torch.Tensor) -> torch.Tensor:
    d = divide(signed_max(blocks), -8)
    q = _codes(blocks * safe_reciprocal(d), 8.5, 15)
    return assemble(fp16_bytes(d), pack_nibbles(q[:, :16], q[:, 16:]))


def q4_1(blocks: torch.Tensor) -> torch.Tensor:
    low, high = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)
    d = divide(high - low, 15)
    q = _codes((blocks - low) * safe_reciprocal(d), 0.5, 15)
    return assemble(fp16_bytes(d), fp16_bytes(low), pack_nibbles(q[:, :16], q[:, 16:]))


def _five_bit_payload(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """qh (bit 4 of each of the 32 codes, LSB first) and qs (their low nibbles, paired)."""
    return pack_bits_lsb_first(q >> 4), pack_nibbles(q[:, :16] & 0x0F, q[:, 16:] & 0x0F)


def q5_0(blocks: torch.Tensor) -> torch.Tensor:
    d = divide(signed_max(blocks), -16)
    q = _codes(blocks * safe_reciprocal(d), 16.5, 31)
    return assemble(fp16_bytes(d), *_five_bit_payload(q))


def q5_1(blocks: torch.Tensor) -> torch.Tensor:
    low, high = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)
    d = divide(high - low, 31)
    q = _codes((blocks - low) * safe_reciprocal(d), 0.5, 31)
    return assemble(fp16_bytes(d), fp16_bytes(low), *_five_bit_payload(q))
