"""Bit-level helpers shared by the GGUF block encoders (all little-endian, as GGML stores them)."""
from __future__ import annotations

import torch


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C ``roundf``: ties away from zero, computed exactly as floor(|x|) + floor(2 * frac)."""
    magnitude = x.abs()
    whole = magnitude.floor()
    return torch.sign(x) * (whole + (2 * (magnitude - whole)).floor())


def divide(values: torch.Tensor, divisor: float) -> torch.Tensor:
    """``values / divisor`` as IEEE float division on every device.

    PyTorch's CUDA kernel turns division by a Python scalar into multiplication by the
    scalar's reciprocal. For divisors that are not powers of two (127, 15, 31) that differs
    from numpy's division in the last bit, and a last-bit change in a block scale can change
    its fp16 value and every code. Dividing by a tensor on the same device keeps true division.
    """
    return values / torch.full((), divisor, dtype=values.dtype, device=values.device)


def fp16_bytes(values: torch.Tensor) -> torch.Tensor:
    """[n, 1] float -> [n, 2] uint8: the IEEE half (round to nearest even) of each value."""
    return values.to(torch.float16).contiguous().view(torch.uint8)


def safe_reciprocal(values: torch.Tensor) -> torch.Tensor:
    """1 / values, with 0 where values == 0 (an all-zero block quantizes to zeros)."""
    return torch.where(values == 0, torch.zeros_like(values), 1 / values)


def pack_nibbles(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Two uint8 tensors of values < 16 -> one byte each: ``low | high << 4`` (callers mask wider codes)."""
    return low | (high << 4)


def assemble(*fields: torch.Tensor) -> torch.Tensor:
    """[n, a], [n, b], ... uint8 -> [n, a + b + ...]: the fields of each block, side by side."""
    out = torch.empty(fields[0].shape[0], sum(f.shape[1] for f in fields), dtype=torch.uint8, device=fields[0].device)
    start = 0
    for field in fields:
        out[:, start:start + field.shape[1]] = field
        start += field.shape[1]
    return out


def pack_bits_lsb_first(bits: torch.Tensor) -> torch.Tensor:
    """[..., 8k] of 0/1 -> [..., k] uint8, element 8i + j in bit j of byte i (numpy's bitorder="little")."""
    grouped = bits.to(torch.uint8).reshape(*bits.shape[:-1], -1, 8)
    weights = (1 << torch.arange(8, device=bits.device, dtype=torch.int32)).to(torch.uint8)
    return (grouped * weights).sum(-1, dtype=torch.int32).to(torch.uint8)
