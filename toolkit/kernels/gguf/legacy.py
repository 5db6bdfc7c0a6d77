"""Torch dequantizers for the float types and the 32-element block types.

Each takes uint8 blocks ``[N, type_size]`` and returns float32 ``[N, block_size]``, doing
the float32 arithmetic in the same order as ggml / gguf-py so results are bit-identical.
"""
from __future__ import annotations

import torch

from .bits import FP4_E2M1_X2_VALUES, IQ4_NL_VALUES, f16, lookup, unpack


def f32(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.view(torch.float32)


def f16_(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.view(torch.float16).float()


def bf16(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.view(torch.bfloat16).float()


def q4_0(blocks: torch.Tensor) -> torch.Tensor:
    """d (fp16), then 16 bytes: low nibbles are elements 0..15, high nibbles 16..31; q - 8."""
    q = unpack(blocks[:, 2:], group=16, bits=4).float() - 8
    return f16(blocks, 0) * q


def q4_1(blocks: torch.Tensor) -> torch.Tensor:
    """d, m (fp16), 16 bytes of nibbles; d * q + m."""
    q = unpack(blocks[:, 4:], group=16, bits=4).float()
    return f16(blocks, 0) * q + f16(blocks, 2)


def _fifth_bit(qh: torch.Tensor) -> torch.Tensor:
    """Bit i of the little-endian uint32 ``qh`` is the fifth bit of element i."""
    return unpack(qh, group=1, bits=1)


def q5_0(blocks: torch.Tensor) -> torch.Tensor:
    """d, qh (4 bytes), 16 bytes of nibbles; q (5 bits) - 16."""
    q = unpack(blocks[:, 6:], group=16, bits=4) | (_fifth_bit(blocks[:, 2:6]) << 4)
    return f16(blocks, 0) * (q.float() - 16)


def q5_1(blocks: torch.Tensor) -> torch.Tensor:
    """d, m, qh (4 bytes), 16 bytes of nibbles; d * q + m."""
    q = unpack(blocks[:, 8:], group=16, bits=4) | (_fifth_bit(blocks[:, 4:8]) << 4)
    return f16(blocks, 0) * q.float() + f16(blocks, 2)


def q8_0(blocks: torch.Tensor) -> torch.Tensor:
    """d, then 32 int8 values."""
    q = blocks[:, 2:].contiguous().view(torch.int8).float()
    return q * f16(blocks, 0)


def iq4_nl(blocks: torch.Tensor) -> torch.Tensor:
    """Like Q4_0, but each nibble indexes a non-linear 16-level codebook."""
    return f16(blocks, 0) * lookup(IQ4_NL_VALUES, unpack(blocks[:, 2:], group=16, bits=4))


def e8m0_half(exponent: torch.Tensor) -> torch.Tensor:
    """ggml's ``e8m0_to_fp32_half``: 2**(e - 128) as float32, built from its bits (denormal below e=2)."""
    e = exponent.to(torch.int32)
    bits = torch.where(e < 2, torch.bitwise_left_shift(torch.full_like(e, 0x00200000), e), (e - 1) << 23)
    return bits.view(torch.float32)


def mxfp4(blocks: torch.Tensor) -> torch.Tensor:
    """One e8m0 exponent byte, then 16 bytes of fp4 (E2M1) nibbles."""
    values = lookup(FP4_E2M1_X2_VALUES, unpack(blocks[:, 1:], group=16, bits=4))
    return e8m0_half(blocks[:, :1]) * values


DEQUANTIZERS = {
    "F32": f32, "F16": f16_, "BF16": bf16, "Q4_0": q4_0, "Q4_1": q4_1, "Q5_0": q5_0, "Q5_1": q5_1,
    "Q8_0": q8_0, "IQ4_NL": iq4_nl, "MXFP4": mxfp4,
}
