"""Torch dequantizers for the lattice-codebook I-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
IQ3_XXS, IQ3_S).

These types index fixed codebooks ("grids" of 4 or 8 values) and a sign table. The tables are
format data, taken from gguf-py (the format's reference) rather than copied here; the decoding
is our own. Same contract as ``legacy.py``: uint8 ``[N, type_size]`` in, float32
``[N, 256]`` out, float32 arithmetic in ggml's order (bit-identical to gguf-py).
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from gguf import quants

from .bits import f16, unpack


@functools.lru_cache(maxsize=None)
def _grid(type_name: str, device: torch.device) -> torch.Tensor:
    """The type's codebook, float32 ``[entries, width]``."""
    cls = getattr(quants, type_name)
    cls.init_grid()
    return torch.from_numpy(np.ascontiguousarray(cls.grid.reshape(cls.grid_shape))).to(device)


@functools.lru_cache(maxsize=None)
def _sign_bytes(device: torch.device) -> torch.Tensor:
    """ksigns: 7 stored sign bits -> 8 sign bits with even parity."""
    return torch.frombuffer(bytearray(quants.IQ2_XXS.ksigns), dtype=torch.uint8).to(device)


def _signs(bits: torch.Tensor) -> torch.Tensor:
    """uint8 sign bytes ``[N, k]`` -> +-1.0 ``[N, 8k]`` (bit i of a byte: element i)."""
    return 1.0 - 2.0 * unpack(bits, group=1, bits=1).float()


def _le_u32(b: torch.Tensor) -> torch.Tensor:
    """Little-endian uint32 of each 4 bytes, as int64 ``[N, k]`` (b: uint8 ``[N, 4k]``)."""
    b = b.reshape(b.shape[0], -1, 4).long()
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def _lookup(type_name: str, index: torch.Tensor) -> torch.Tensor:
    return _grid(type_name, index.device)[index.long()]


def iq2_xxs(blocks: torch.Tensor) -> torch.Tensor:
    """d, then 8 x (4 grid bytes, uint32 of four 7-bit sign indices and a 4-bit scale)."""
    n = blocks.shape[0]
    sub = blocks[:, 2:].reshape(n, 8, 8)
    aux = _le_u32(sub[:, :, 4:].reshape(n, 32))                                      # [n, 8]
    db = (f16(blocks, 0) * (0.5 + (aux >> 28).float()) * 0.25).view(n, 8, 1, 1)
    sign_index = (aux.unsqueeze(-1) >> torch.tensor([0, 7, 14, 21], device=blocks.device)) & 127
    signs = _signs(_sign_bytes(blocks.device)[sign_index.reshape(n, 32)]).view(n, 8, 4, 8)
    grid = _lookup("IQ2_XXS", sub[:, :, :4].reshape(n, 32)).view(n, 8, 4, 8)
    return (db * grid * signs).view(n, 256)


def iq2_xs(blocks: torch.Tensor) -> torch.Tensor:
    """d, 32 uint16 (9-bit grid index, 7-bit sign index), 8 bytes of 4-bit scales."""
    n = blocks.shape[0]
    qs = blocks[:, 2:66].reshape(n, 32, 2).long()
    qs = qs[..., 0] | (qs[..., 1] << 8)
    db = (f16(blocks, 0) * (0.5 + unpack(blocks[:, 66:74], group=1, bits=4).float()) * 0.25).view(n, 16, 1, 1)
    signs = _signs(_sign_bytes(blocks.device)[qs >> 9]).view(n, 16, 2, 8)
    grid = _lookup("IQ2_XS", qs & 511).view(n, 16, 2, 8)
    return (db * grid * signs).view(n, 256)


def iq2_s(blocks: torch.Tensor) -> torch.Tensor:
    """d, 32 grid bytes, 32 sign bytes, 8 bytes of 2-bit index tops, 8 bytes of 4-bit scales."""
    n = blocks.shape[0]
    db = (f16(blocks, 0) * (0.5 + unpack(blocks[:, 74:82], group=1, bits=4).float()) * 0.25).view(n, 16, 1, 1)
    signs = _signs(blocks[:, 34:66]).view(n, 16, 2, 8)
    index = blocks[:, 2:34].long() | (unpack(blocks[:, 66:74], group=1, bits=2).long() << 8)
    grid = _lookup("IQ2_S", index).view(n, 16, 2, 8)
    return (db * grid * signs).view(n, 256)


def iq3_xxs(blocks: torch.Tensor) -> torch.Tensor:
    """d, 64 grid bytes (4-wide grid), 8 uint32 of four 7-bit sign indices and a 4-bit scale."""
    n = blocks.shape[0]
    aux = _le_u32(blocks[:, 66:98])                                                  # [n, 8]
    db = (f16(blocks, 0) * (0.5 + (aux >> 28).float()) * 0.5).view(n, 8, 1, 1)
    sign_index = (aux.unsqueeze(-1) >> torch.tensor([0, 7, 14, 21], device=blocks.device)) & 127
    signs = _signs(_sign_bytes(blocks.device)[sign_index.reshape(n, 32)]).view(n, 8, 4, 8)
    grid = _lookup("IQ3_XXS", blocks[:, 2:66]).view(n, 8, 4, 8)
    return (db * grid * signs).view(n, 256)


def iq3_s(blocks: torch.Tensor) -> torch.Tensor:
    """d, 64 grid bytes, 8 bytes of ninth index bits, 32 sign bytes, 4 bytes of 4-bit scales."""
    n = blocks.shape[0]
    db = (f16(blocks, 0) * (1 + 2 * unpack(blocks[:, 106:110], group=1, bits=4).float())).view(n, 8, 1, 1)
    signs = _signs(blocks[:, 74:106]).view(n, 8, 4, 8)
    index = blocks[:, 2:66].long() | (unpack(blocks[:, 66:74], group=1, bits=1).long() << 8)
    grid = _lookup("IQ3_S", index).view(n, 8, 4, 8)
    return (db * grid * signs).view(n, 256)


def iq1_s(blocks: torch.Tensor) -> torch.Tensor:
    """d, 32 grid bytes, 8 uint16: 4 x 3 index-top bits, a 3-bit scale and the delta's sign."""
    n = blocks.shape[0]
    qh = blocks[:, 34:50].reshape(n, 8, 2).long()
    qh = qh[..., 0] | (qh[..., 1] << 8)                                               # [n, 8]
    dl = (f16(blocks, 0) * (2 * ((qh >> 12) & 7) + 1).float()).view(n, 8, 1, 1)
    delta = torch.where((qh & 0x8000) == 0, 0.125, -0.125).float().view(n, 8, 1, 1)
    tops = (qh.unsqueeze(-1) >> torch.tensor([0, 3, 6, 9], device=blocks.device)) & 7
    grid = _lookup("IQ1_S", blocks[:, 2:34].long() | (tops.reshape(n, 32) << 8)).view(n, 8, 4, 8)
    return (dl * (grid + delta)).view(n, 256)


def iq1_m(blocks: torch.Tensor) -> torch.Tensor:
    """32 grid bytes, 16 bytes of (3 index-top bits, delta sign) nibbles, 4 uint16 holding 3-bit
    scales, with the fp16 super-block scale spread over their top nibbles."""
    n = blocks.shape[0]
    scales = blocks[:, 48:56].reshape(n, 4, 2).long()
    scales = scales[..., 0] | (scales[..., 1] << 8)                                   # [n, 4]
    d_bits = ((scales & 0xF000) >> torch.tensor([12, 8, 4, 0], device=blocks.device)).sum(-1, keepdim=True)
    d = d_bits.to(torch.int16).view(torch.float16).float()                          # [n, 1]
    sub = (scales.unsqueeze(-1) >> torch.tensor([0, 3, 6, 9], device=blocks.device)) & 7
    dl = (d * (2 * sub.reshape(n, 16) + 1).float()).view(n, 8, 2, 1, 1)
    nibbles = unpack(blocks[:, 32:48], group=1, bits=4).long()                      # [n, 32]
    delta = torch.where((nibbles & 8) == 0, 0.125, -0.125).float().view(n, 8, 2, 2, 1)
    grid = _lookup("IQ1_M", blocks[:, :32].long() | ((nibbles & 7) << 8)).view(n, 8, 2, 2, 8)
    return (dl * (grid + delta)).view(n, 256)


DEQUANTIZERS = {"IQ1_S": iq1_s, "IQ1_M": iq1_m, "IQ2_XXS": iq2_xxs, "IQ2_XS": iq2_xs, "IQ2_S": iq2_s,
                "IQ3_XXS": iq3_xxs, "IQ3_S": iq3_s}
