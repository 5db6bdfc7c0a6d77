"""Torch dequantizers for the 256-element super-block types (K-quants, IQ4_XS, ternary, NVFP4).

Same contract as ``legacy.py``: uint8 ``[N, type_size]`` in, float32 ``[N, block_size]`` out,
float32 arithmetic in ggml's order (bit-identical to gguf-py).
"""
from __future__ import annotations

import torch

from .bits import FP4_E2M1_X2_VALUES, IQ4_NL_VALUES, f16, lookup, unpack


def q2_k(blocks: torch.Tensor) -> torch.Tensor:
    """16 scale bytes (low nibble scale, high nibble min), 64 bytes of 2-bit q, d, dmin."""
    n = blocks.shape[0]
    scales = blocks[:, :16]
    dl = (f16(blocks, 80) * (scales & 0xF).float()).view(n, 16, 1)
    ml = (f16(blocks, 82) * (scales >> 4).float()).view(n, 16, 1)
    q = unpack(blocks[:, 16:80], group=32, bits=2).view(n, 16, 16).float()
    return (dl * q - ml).view(n, 256)


def _q3_k_scales(packed: torch.Tensor) -> torch.Tensor:
    """Sixteen 6-bit signed scales: low 4 bits from bytes 0..7, high 2 bits from bytes 8..11."""
    low = unpack(packed[:, :8], group=8, bits=4)
    high = unpack(packed[:, 8:12], group=4, bits=2)
    return (low | (high << 4)).float() - 32


def q3_k(blocks: torch.Tensor) -> torch.Tensor:
    """hmask (32 bytes), 64 bytes of 2-bit q, 12 scale bytes, d; q - 4 where the hmask bit is 0."""
    n = blocks.shape[0]
    dl = (f16(blocks, 108) * _q3_k_scales(blocks[:, 96:108])).view(n, 16, 1)
    low = unpack(blocks[:, 32:96], group=32, bits=2).float()
    high_clear = 1 - unpack(blocks[:, :32], group=32, bits=1).float()
    q = (low - 4 * high_clear).view(n, 16, 16)
    return (dl * q).view(n, 256)


def k_scale_min(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: eight 6-bit scales and eight 6-bit mins packed in 12 bytes.

    Bytes 0-3 hold scales 0-3 (low 6 bits), 4-7 mins 0-3; bytes 8-11 hold the low 4 bits of
    scale/min 4-7, whose top 2 bits sit in the spare top bits of bytes 0-7.
    """
    n = packed.shape[0]
    d, m, md = packed.reshape(n, 3, 4).unbind(1)
    scale = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    minimum = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return scale.float(), minimum.float()


def _k_affine(blocks: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(d * scale) * q - dmin * min over eight 32-element sub-blocks (Q4_K and Q5_K)."""
    n = blocks.shape[0]
    scale, minimum = k_scale_min(blocks[:, 4:16])
    d = (f16(blocks, 0) * scale).view(n, 8, 1)
    dm = (f16(blocks, 2) * minimum).view(n, 8, 1)
    return (d * q.view(n, 8, 32).float() - dm).view(n, 256)


def q4_k(blocks: torch.Tensor) -> torch.Tensor:
    """d, dmin, 12 scale bytes, 128 bytes of nibbles (per 32 bytes: 32 low, then 32 high)."""
    return _k_affine(blocks, unpack(blocks[:, 16:], group=32, bits=4))


def q5_k(blocks: torch.Tensor) -> torch.Tensor:
    """Q4_K plus a 32-byte qh whose bit s of byte i is the fifth bit of element 32 * s + i."""
    q = unpack(blocks[:, 48:], group=32, bits=4) | (unpack(blocks[:, 16:48], group=32, bits=1) << 4)
    return _k_affine(blocks, q)


def q6_k(blocks: torch.Tensor) -> torch.Tensor:
    """128 bytes of low nibbles, 64 bytes of high 2 bits, 16 int8 scales, d; q - 32."""
    n = blocks.shape[0]
    low = unpack(blocks[:, :128], group=64, bits=4)
    high = unpack(blocks[:, 128:192], group=32, bits=2)
    scales = blocks[:, 192:208].contiguous().view(torch.int8).float()
    d = (f16(blocks, 208) * scales).view(n, 16, 1)
    q = ((low | (high << 4)).float() - 32).view(n, 16, 16)
    return (d * q).view(n, 256)


def iq4_xs(blocks: torch.Tensor) -> torch.Tensor:
    """d, 2 bytes of scale high bits, 4 bytes of scale low nibbles, 128 bytes of codebook nibbles."""
    n = blocks.shape[0]
    low = unpack(blocks[:, 4:8], group=1, bits=4)
    high = unpack(blocks[:, 2:4], group=1, bits=2)
    dl = (f16(blocks, 0) * ((low | (high << 4)).float() - 32)).view(n, 8, 1)
    values = lookup(IQ4_NL_VALUES, unpack(blocks[:, 8:], group=16, bits=4)).view(n, 8, 32)
    return (dl * values).view(n, 256)


def _base3_digits(packed: torch.Tensor, group: int, num_digits: int) -> torch.Tensor:
    """TQ1_0 stores 5 (or 4) ternary digits per byte as a fixed-point fraction: multiplying the
    byte by 3**k (mod 256) moves digit k to the top, and (byte * 3) >> 8 reads it."""
    rows = packed.shape[0]
    powers = torch.tensor([3 ** k for k in range(num_digits)], dtype=torch.int32, device=packed.device)
    shifted = (packed.to(torch.int32).reshape(rows, -1, 1, group) * powers.view(1, 1, -1, 1)) & 0xFF
    return ((shifted * 3) >> 8).reshape(rows, -1)


def tq1_0(blocks: torch.Tensor) -> torch.Tensor:
    """48 bytes of 5 trits, 4 bytes of 4 trits, d; values in {-1, 0, 1}."""
    digits = torch.cat([_base3_digits(blocks[:, :32], 32, 5), _base3_digits(blocks[:, 32:48], 16, 5),
                        _base3_digits(blocks[:, 48:52], 4, 4)], dim=1)
    return f16(blocks, 52) * (digits.float() - 1)


def tq2_0(blocks: torch.Tensor) -> torch.Tensor:
    """64 bytes of 2-bit values (q - 1), then d."""
    return f16(blocks, 64) * (unpack(blocks[:, :64], group=32, bits=2).float() - 1)


def _ue4m3_table(device) -> torch.Tensor:
    """Unsigned E4M3 scale bytes -> float32, halved (the doubled-fp4 convention); 0 and 0x7F -> 0."""
    codes = torch.arange(256, device=device)
    exponent, mantissa = (codes >> 3) & 0xF, (codes & 7).double()
    value = torch.where(exponent == 0, mantissa * 2.0 ** -9, (1 + mantissa / 8) * 2.0 ** (exponent - 7).double())
    value = torch.where((codes == 0) | (codes == 0x7F), 0.0, value * 0.5)
    return value.float()  # every value is exact in float32


def nvfp4(blocks: torch.Tensor) -> torch.Tensor:
    """Four E4M3 sub-block scales, then four 8-byte groups of fp4 nibbles (8 low, then 8 high)."""
    n = blocks.shape[0]
    d = _ue4m3_table(blocks.device)[blocks[:, :4].long()].view(n, 4, 1)
    values = lookup(FP4_E2M1_X2_VALUES, unpack(blocks[:, 4:], group=8, bits=4)).view(n, 4, 16)
    return (d * values).view(n, 64)


DEQUANTIZERS = {
    "Q2_K": q2_k, "Q3_K": q3_k, "Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k, "IQ4_XS": iq4_xs,
    "TQ1_0": tq1_0, "TQ2_0": tq2_0, "NVFP4": nvfp4,
}
