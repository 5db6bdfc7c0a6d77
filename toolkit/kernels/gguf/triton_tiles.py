"""Triton device functions that unpack one tile of packed GGUF rows into float32, in natural
column order: used by the dequantize kernel (where it runs near HBM bandwidth) and by the matmul
for the types without a word-wise tile (``triton_words``).

A tile is ``[BN rows, BK columns]`` starting at column ``k0``; ``BK`` is a power of two that
divides the type's block (legacy types: a multiple of 32; super-block types: a multiple of
the scale sub-block and at most 256), so a tile never straddles a super-block. Scales are
loaded once per (row, sub-block) and broadcast over the sub-block; quant bytes once per element
(neighbouring elements share bytes, which the L1 cache absorbs). Float arithmetic follows
ggml's order; the compiler may fuse a multiply-add, so results match the torch reference to
about one float32 ulp.

Type ids are the ``GGMLQuantizationType`` values.
"""
from __future__ import annotations

import triton
import triton.language as tl

# Globals read inside @triton.jit must be constexpr.
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL = (tl.constexpr(v) for v in (2, 3, 6, 7, 8, 20))
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS = (tl.constexpr(v) for v in (10, 11, 12, 13, 14, 23))


@triton.jit
def _byte(ptr):
    return tl.load(ptr).to(tl.int32)


@triton.jit
def _half(ptr):
    """A little-endian fp16 at any byte address, as float32 (two byte loads: no alignment needed)."""
    lo = tl.load(ptr).to(tl.uint16)
    hi = tl.load(ptr + 1).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def legacy_tile(w_ptr, row_off, k0, table_ptr, QTYPE: tl.constexpr, TS: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr):
    """32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL): float32 ``[BN, BK]``."""
    NB: tl.constexpr = BK // 32
    blk = k0 // 32 + tl.arange(0, NB)
    base = w_ptr + row_off[:, None] + blk[None, :] * TS          # [BN, NB] block addresses
    i = tl.arange(0, 32)[None, None, :]
    b3 = base[:, :, None]
    d = _half(base)[:, :, None]
    if QTYPE == Q8_0:
        q = tl.load(b3 + 2 + i).to(tl.int8, bitcast=True).to(tl.float32)
        w = q * d
    elif QTYPE == Q4_0:
        q = (_byte(b3 + 2 + i % 16) >> ((i // 16) * 4)) & 15
        w = d * (q - 8).to(tl.float32)
    elif QTYPE == IQ4_NL:
        q = (_byte(b3 + 2 + i % 16) >> ((i // 16) * 4)) & 15
        w = d * tl.load(table_ptr + q)
    elif QTYPE == Q4_1:
        q = (_byte(b3 + 4 + i % 16) >> ((i // 16) * 4)) & 15
        w = d * q.to(tl.float32) + _half(base + 2)[:, :, None]
    elif QTYPE == Q5_0:
        high = (_byte(b3 + 2 + i // 8) >> (i % 8)) & 1
        q = ((_byte(b3 + 6 + i % 16) >> ((i // 16) * 4)) & 15) | (high << 4)
        w = d * (q - 16).to(tl.float32)
    else:  # Q5_1
        high = (_byte(b3 + 4 + i // 8) >> (i % 8)) & 1
        q = ((_byte(b3 + 8 + i % 16) >> ((i // 16) * 4)) & 15) | (high << 4)
        w = d * q.to(tl.float32) + _half(base + 2)[:, :, None]
    return tl.reshape(w, (BN, BK))


@triton.jit
def _k_scale_min(base, s):
    """Q4_K/Q5_K 6-bit scale and min of sub-blocks ``s`` (12 packed bytes at offset 4)."""
    ptr = base[:, None] + 4 + (s % 4)[None, :]
    lo, mid, hi = _byte(ptr), _byte(ptr + 4), _byte(ptr + 8)
    first = (s < 4)[None, :]
    scale = tl.where(first, lo & 63, (hi & 15) | ((lo >> 6) << 4))
    minimum = tl.where(first, mid & 63, (hi >> 4) | ((mid >> 6) << 4))
    return scale.to(tl.float32), minimum.to(tl.float32)


@triton.jit
def kquant_tile(w_ptr, row_off, k0, table_ptr, QTYPE: tl.constexpr, TS: tl.constexpr, SUB: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr):
    """256-element super-block types (Q2_K..Q6_K, IQ4_XS): float32 ``[BN, BK]``.

    ``SUB`` is the scale sub-block (16 or 32); ``j`` is each element's index in its super-block.
    """
    NS: tl.constexpr = BK // SUB
    base = w_ptr + row_off + (k0 // 256) * TS                   # [BN] super-block addresses
    s = (k0 % 256) // SUB + tl.arange(0, NS)
    j = s[None, :, None] * SUB + tl.arange(0, SUB)[None, None, :]
    b3 = base[:, None, None]
    b2 = base[:, None]
    if QTYPE == Q4_K or QTYPE == Q5_K:
        scale, minimum = _k_scale_min(base, s)
        if QTYPE == Q4_K:
            q = (_byte(b3 + 16 + (j // 64) * 32 + j % 32) >> (((j // 32) % 2) * 4)) & 15
        else:  # Q5_K: the same nibbles after a 32-byte qh holding each element's fifth bit
            q = (_byte(b3 + 48 + (j // 64) * 32 + j % 32) >> (((j // 32) % 2) * 4)) & 15
            q = q | (((_byte(b3 + 16 + j % 32) >> (j // 32)) & 1) << 4)
        dl = _half(base)[:, None] * scale
        ml = _half(base + 2)[:, None] * minimum
        w = dl[:, :, None] * q.to(tl.float32) - ml[:, :, None]
    elif QTYPE == Q6_K:
        low = (_byte(b3 + (j // 128) * 64 + j % 64) >> (((j // 64) % 2) * 4)) & 15
        high = (_byte(b3 + 128 + (j // 128) * 32 + j % 32) >> (((j // 32) % 4) * 2)) & 3
        scale = tl.load(b2 + 192 + s[None, :]).to(tl.int8, bitcast=True).to(tl.float32)
        dl = _half(base + 208)[:, None] * scale
        w = dl[:, :, None] * ((low | (high << 4)) - 32).to(tl.float32)
    elif QTYPE == Q2_K:
        packed = _byte(b2 + s[None, :])
        q = (_byte(b3 + 16 + (j // 128) * 32 + j % 32) >> (((j // 32) % 4) * 2)) & 3
        dl = _half(base + 80)[:, None] * (packed & 15).to(tl.float32)
        ml = _half(base + 82)[:, None] * (packed >> 4).to(tl.float32)
        w = dl[:, :, None] * q.to(tl.float32) - ml[:, :, None]
    elif QTYPE == Q3_K:
        low = (_byte(b2 + 96 + (s % 8)[None, :]) >> ((s // 8) * 4)[None, :]) & 15
        high = (_byte(b2 + 104 + (s % 4)[None, :]) >> ((s // 4) * 2)[None, :]) & 3
        dl = _half(base + 108)[:, None] * ((low | (high << 4)) - 32).to(tl.float32)
        q = (_byte(b3 + 32 + (j // 128) * 32 + j % 32) >> (((j // 32) % 4) * 2)) & 3
        hbit = (_byte(b3 + j % 32) >> (j // 32)) & 1
        w = dl[:, :, None] * (q - 4 * (1 - hbit)).to(tl.float32)
    else:  # IQ4_XS
        low = (_byte(b2 + 4 + (s // 2)[None, :]) >> ((s % 2) * 4)[None, :]) & 15
        high = (_byte(b2 + 2 + (s // 4)[None, :]) >> ((s % 4) * 2)[None, :]) & 3
        dl = _half(base)[:, None] * ((low | (high << 4)) - 32).to(tl.float32)
        i = tl.arange(0, SUB)[None, None, :]
        code = (_byte(b3 + 8 + s[None, :, None] * 16 + i % 16) >> ((i // 16) * 4)) & 15
        w = dl[:, :, None] * tl.load(table_ptr + code)
    return tl.reshape(w, (BN, BK))


@triton.jit
def tile(w_ptr, row_off, k0, table_ptr, QTYPE: tl.constexpr, TS: tl.constexpr, BLOCK: tl.constexpr,
         SUB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Float32 ``[BN, BK]`` of the rows at byte offsets ``row_off`` (int64 ``[BN]``), columns k0.."""
    if BLOCK == 32:
        return legacy_tile(w_ptr, row_off, k0, table_ptr, QTYPE, TS, BN, BK)
    else:
        return kquant_tile(w_ptr, row_off, k0, table_ptr, QTYPE, TS, SUB, BN, BK)
