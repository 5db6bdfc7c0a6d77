"""Step functions of a GEMV on packed GGUF rows with 8-bit activations and 4-way integer dot products
(dp4a), and the activation quantizer. The MoE route kernel (``gguf_moe.triton_moe``) runs these steps
with its routes as the token axis; dense matmuls of 1-8 tokens use ``triton_gemv_tokens``, which
unrolls its tokens instead (this file's leading token axis cost a load and unpack per token).

Why: the float GEMV (``triton_words``) turns every weight into a float32 before its
multiply-add, ~6 instructions per weight, which capped a one-token matmul at ~30% of HBM
bandwidth on an H100. Here the activation row is first quantized to int8 in blocks of 32 (one
float32 scale per block: ``quantize_activations_kernel``), and each 32-bit word of packed weights
becomes 4 bytes with one to three mask/shift/or instructions, so one ``dp4a`` multiplies and
adds four weights. Scales are applied once per (row, scale block), in float32.

Numbers: integer sums are exact; the one difference from the float path is the activation
rounding (|x - d q| <= d / 2, d = max|x of the block| / 127), the scheme llama.cpp's CUDA GEMV
uses. ``tests/test_gguf_kernels.py`` checks results against that bound.

Weight words are read in each block's own byte order; for every type here the 4 bytes of a word
are 4 consecutive columns, so the matching activation word is loaded directly (no permutation).
Offsets (``q - 8`` and the like) and K-quant minimums use the activation sum of the scale block,
itself a dp4a against ``0x01010101``.

``DP4A=False`` computes the same integer sums with shifts and multiplies, so the kernels also
run under the Triton interpreter (``TRITON_INTERPRET=1``) on a CPU.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..triton_int8 import round_int8_blocks
from ..triton_pdl import wait_for_previous
from .triton_words import _k_scale_min, _u16, _u32, half_bits, load_u16

Q4_0, Q5_0, Q8_0 = (tl.constexpr(v) for v in (2, 6, 8))
Q4_K, Q5_K, Q6_K = (tl.constexpr(v) for v in (12, 13, 14))
# Rank of each step function's tensors (token, row, then the type's block axes).
STEP_AXES = {2: 4, 6: 4, 8: 4, 12: 5, 13: 5, 14: 6}
LOW4: tl.constexpr = tl.constexpr(0x0F0F0F0F)
LOW2: tl.constexpr = tl.constexpr(0x03030303)
ONES: tl.constexpr = tl.constexpr(0x01010101)


@triton.jit
def dp4a(a, b, acc, DP4A: tl.constexpr):
    """``acc + sum_i a.byte[i] * b.byte[i]`` with signed bytes (int32 words in, int32 out)."""
    a = a.to(tl.int32, bitcast=True)
    b = b.to(tl.int32, bitcast=True)
    if DP4A:
        return tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, acc],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        for shift in tl.static_range(0, 32, 8):
            acc += ((a << (24 - shift)) >> 24) * ((b << (24 - shift)) >> 24)
        return acc


@triton.jit
def _dot(a, b, DP4A: tl.constexpr):
    """dp4a of two broadcastable int32 word tensors, from zero."""
    a, b = tl.broadcast(a.to(tl.int32, bitcast=True), b.to(tl.int32, bitcast=True))
    return dp4a(a, b, tl.zeros(a.shape, tl.int32), DP4A)


@triton.jit
def _byte_sum(x, DP4A: tl.constexpr):
    """Sum of the 4 signed bytes of each word (a dp4a against 0x01010101)."""
    x = x.to(tl.int32, bitcast=True)
    return dp4a(x, tl.full(x.shape, 0x01010101, tl.int32), tl.zeros(x.shape, tl.int32), DP4A)


@triton.jit
def load_u32_from_u16(ptr, index, EVICT: tl.constexpr):
    """The uint32 at ``ptr + 4 * index`` where ``ptr`` is only 2-aligned: two uint16 loads (``EVICT``: their
    eviction policy, as ``triton_words.load_u16``)."""
    return load_u16(ptr, 2 * index, EVICT) | (load_u16(ptr, 2 * index + 1, EVICT) << 16)


@triton.jit
def _u32_from_u16(ptr, index):
    return load_u32_from_u16(ptr, index, "")


@triton.jit
def _spread_bits(h):
    """4 bits (``h`` in 0..15) -> bit 4 of 4 bytes: bit i goes to byte i (no carries between terms)."""
    return ((h * 0x00204081) & ONES) << 4


@triton.jit
def quantize_activations_kernel(x_ptr, q_ptr, d_ptr, s_ptr, K, stride_x, BK: tl.constexpr, SUMS: tl.constexpr,
                                PDL: tl.constexpr = False):
    """Program (token t, column tile): int8 blocks of 32, packed 4 to an int32 word, and their scales.

    ``q[t, K / 4]`` int32 words (byte i of word w = column 4w + i), ``d[t, K / 32]`` float32; with
    ``SUMS`` also ``s[t, K / 32] = d * sum(q)`` of each block (float32). ``PDL``: ``triton_pdl``."""
    wait_for_previous(PDL)
    t, kb = tl.program_id(0), tl.program_id(1)
    G: tl.constexpr = BK // 32
    cols = kb * BK + tl.arange(0, BK)
    x = tl.reshape(tl.load(x_ptr + t.to(tl.int64) * stride_x + cols).to(tl.float32), (G, 32))
    rounded, d = round_int8_blocks(x)                                           # [G, 32] in -127..127, [G]
    if SUMS:
        tl.store(s_ptr + t.to(tl.int64) * (K // 32) + kb * G + tl.arange(0, G),
                 tl.sum(rounded, axis=1).to(tl.float32) * d)
    q = tl.reshape(rounded & 255, (G * 8, 4)) << (tl.arange(0, 4) * 8)[None, :]
    words = tl.sum(q, axis=1)                                     # the 4 bytes occupy disjoint bits
    tl.store(q_ptr + t.to(tl.int64) * (K // 4) + kb * (BK // 4) + tl.arange(0, BK // 4), words)
    tl.store(d_ptr + t.to(tl.int64) * (K // 32) + kb * G + tl.arange(0, G), d)


@triton.jit
def _legacy_step(w_ptr, row_off, k0, xq_rows, xd_rows, QTYPE: tl.constexpr, TS: tl.constexpr,
                 BK: tl.constexpr, DP4A: tl.constexpr):
    """Q4_0 / Q5_0 / Q8_0 (32-element blocks): float32 ``[BM, BN]`` partial dot products of ``BK``
    columns. ``row_off [BN]``: byte offsets of the weight rows; ``xq_rows`` / ``xd_rows``:
    ``[BM, 1, 1, 1]`` pointers to each token's activation words / scales."""
    G: tl.constexpr = BK // 32
    g = tl.arange(0, G)[None, None, :, None]
    block = w_ptr + row_off[None, :, None, None] + (k0 // 32 + g) * TS                  # [1, BN, G, 1]
    d = half_bits(_u16(block, 0))
    x_word = xq_rows + k0 // 4 + 8 * g                                                  # [BM, 1, G, 1]
    xd = tl.load(xd_rows + k0 // 32 + g)
    if QTYPE == Q8_0:
        i = tl.arange(0, 8)[None, None, None, :]
        isum = tl.sum(_dot(_u32_from_u16(block + 2, i), tl.load(x_word + i), DP4A), axis=3, keep_dims=True)
    else:
        i = tl.arange(0, 4)[None, None, None, :]
        x_lo, x_hi = tl.load(x_word + i), tl.load(x_word + 4 + i)                     # columns 4i.., 16+4i..
        if QTYPE == Q4_0:
            w = _u32_from_u16(block + 2, i)                                             # [1, BN, G, 4]
            lo, hi = w & LOW4, (w >> 4) & LOW4
            offset = 8
        else:
            w = _u32_from_u16(block + 6, i)
            qh = _u32_from_u16(block + 2, 0 * i)                                        # bit j: fifth bit of column j
            lo = (w & LOW4) | _spread_bits((qh >> (4 * i)) & 15)
            hi = ((w >> 4) & LOW4) | _spread_bits((qh >> (16 + 4 * i)) & 15)
            offset = 16
        xsum = tl.sum(_byte_sum(x_lo, DP4A) + _byte_sum(x_hi, DP4A), axis=3, keep_dims=True)
        isum = tl.sum(_dot(lo, x_lo, DP4A) + _dot(hi, x_hi, DP4A), axis=3, keep_dims=True) - offset * xsum
    return tl.sum(tl.sum(d * xd * isum.to(tl.float32), axis=3), axis=2)


@triton.jit
def _q45k_step(w_ptr, row_off, k0, xq_rows, xd_rows, QTYPE: tl.constexpr, TS: tl.constexpr,
               BK: tl.constexpr, DP4A: tl.constexpr):
    """Q4_K / Q5_K (256-element super-blocks of 4 groups of 64): byte b of qs word 8j + i holds
    column 64j + 4i + b in its low nibble (sub-block 2j) and 64j + 32 + 4i + b in its high one.
    Axes: [token, row, super-block, group, word]."""
    G: tl.constexpr = BK // 256
    s = tl.arange(0, G)[None, None, :, None, None]
    j = tl.arange(0, 4)[None, None, None, :, None]
    i = tl.arange(0, 8)[None, None, None, None, :]
    sb = w_ptr + row_off[None, :, None, None, None] + (k0 // 256 + s) * TS              # [1, BN, G, 1, 1]
    header = _u32(sb, 0)
    d, dmin = half_bits(header), half_bits(header >> 16)
    words0, words1, words2 = _u32(sb + 4, 0), _u32(sb + 4, 1), _u32(sb + 4, 2)
    scale_lo, min_lo = _k_scale_min(words0, words1, words2, 2 * j)                     # [1, BN, G, 4, 1]
    scale_hi, min_hi = _k_scale_min(words0, words1, words2, 2 * j + 1)
    if QTYPE == Q4_K:
        w = _u32(sb + 16, 8 * j + i)                                                    # [1, BN, G, 4, 8]
        lo, hi = w & LOW4, (w >> 4) & LOW4
    else:
        w = _u32(sb + 48, 8 * j + i)
        qh = _u32(sb + 16, i)                          # bit 2j (2j + 1) of byte b: fifth bit of lo (hi)
        lo = (w & LOW4) | (((qh >> (2 * j)) & ONES) << 4)
        hi = ((w >> 4) & LOW4) | (((qh >> (2 * j + 1)) & ONES) << 4)
    x_word = xq_rows + k0 // 4 + 64 * s + 16 * j + i                                    # [BM, 1, G, 4, 8]
    x_lo, x_hi = tl.load(x_word), tl.load(x_word + 8)
    block = xd_rows + k0 // 32 + 8 * s + 2 * j                                          # [BM, 1, G, 4, 1]
    xd_lo, xd_hi = tl.load(block), tl.load(block + 1)
    xs_lo = tl.sum(_byte_sum(x_lo, DP4A), axis=4, keep_dims=True).to(tl.float32)
    xs_hi = tl.sum(_byte_sum(x_hi, DP4A), axis=4, keep_dims=True).to(tl.float32)
    is_lo = tl.sum(_dot(lo, x_lo, DP4A), axis=4, keep_dims=True).to(tl.float32)
    is_hi = tl.sum(_dot(hi, x_hi, DP4A), axis=4, keep_dims=True).to(tl.float32)
    part = (xd_lo * (d * scale_lo * is_lo - dmin * min_lo * xs_lo)
            + xd_hi * (d * scale_hi * is_hi - dmin * min_hi * xs_hi))                  # [BM, BN, G, 4, 1]
    return tl.sum(tl.sum(tl.sum(part, axis=4), axis=3), axis=2)


@triton.jit
def _q6k_word(low, high, low_shift: tl.constexpr, high_shift: tl.constexpr):
    return ((low >> low_shift) & LOW4) | (((high >> high_shift) & LOW2) << 4)


@triton.jit
def _q6k_part(v, x_word, xd_ptrs, sc, d, DP4A: tl.constexpr):
    """One of the 4 column runs of a Q6_K half: weight words ``[1, BN, G, 2, 2, 4]`` (half, 16-column
    sub-block, word), values 0..63 standing for -32..31; ``x_word`` ``[BM, 1, G, 2, 2, 4]``."""
    x = tl.load(x_word)
    xs = tl.sum(_byte_sum(x, DP4A), axis=5, keep_dims=True)
    isum = tl.sum(_dot(v, x, DP4A), axis=5, keep_dims=True) - 32 * xs                   # [BM, BN, G, 2, 2, 1]
    return tl.load(xd_ptrs) * d * sc * isum.to(tl.float32)


@triton.jit
def _q6k_step(w_ptr, row_off, k0, xq_rows, xd_rows, TS: tl.constexpr, BK: tl.constexpr, DP4A: tl.constexpr):
    """Q6_K (210-byte super-blocks, 2-aligned): in half n (128 columns), byte b of ql word i holds
    column 4i + b (low nibble) and 64 + 4i + b (high), of ql word 8 + i columns 32 + 4i + b and
    96 + 4i + b; qh word i holds their top 2 bits at shifts 0, 4, 2, 6. Scales per 16 columns.
    Axes: [token, row, super-block, half, 16-column sub-block, word]."""
    G: tl.constexpr = BK // 256
    s = tl.arange(0, G)[None, None, :, None, None, None]
    n = tl.arange(0, 2)[None, None, None, :, None, None]
    sub = tl.arange(0, 2)[None, None, None, None, :, None]
    i = 4 * sub + tl.arange(0, 4)[None, None, None, None, None, :]        # word of a 32-column run
    sb = w_ptr + row_off[None, :, None, None, None, None] + (k0 // 256 + s) * TS         # [1, BN, G, 1, 1, 1]
    ql_a = _u32_from_u16(sb + 64 * n, i)
    ql_b = _u32_from_u16(sb + 64 * n, 8 + i)
    qh = _u32_from_u16(sb + 128 + 32 * n, i)
    d = half_bits(_u16(sb + 208, 0))
    scales = sb + 192 + 8 * n + sub                                  # int8 scale of run r: scales[2r]
    x_word = xq_rows + k0 // 4 + 64 * s + 32 * n + i                 # [BM, 1, G, 2, 2, 4]
    x_block = xd_rows + k0 // 32 + 8 * s + 4 * n                     # [BM, 1, G, 2, 1, 1]
    total = _q6k_part(_q6k_word(ql_a, qh, 0, 0), x_word, x_block,
                      tl.load(scales).to(tl.int8, bitcast=True).to(tl.float32), d, DP4A)
    total += _q6k_part(_q6k_word(ql_b, qh, 0, 2), x_word + 8, x_block + 1,
                       tl.load(scales + 2).to(tl.int8, bitcast=True).to(tl.float32), d, DP4A)
    total += _q6k_part(_q6k_word(ql_a, qh, 4, 4), x_word + 16, x_block + 2,
                       tl.load(scales + 4).to(tl.int8, bitcast=True).to(tl.float32), d, DP4A)
    total += _q6k_part(_q6k_word(ql_b, qh, 4, 6), x_word + 24, x_block + 3,
                       tl.load(scales + 6).to(tl.int8, bitcast=True).to(tl.float32), d, DP4A)
    return tl.sum(tl.sum(tl.sum(tl.sum(total, axis=5), axis=4), axis=3), axis=2)


@triton.jit
def gemv_step(w_ptr, row_off, k0, xq_rows, xd_rows, QTYPE: tl.constexpr, TS: tl.constexpr, BK: tl.constexpr,
              DP4A: tl.constexpr):
    """``[BM, BN]`` partial dot products of columns ``k0 .. k0 + BK`` for the rows at byte offsets
    ``row_off [BN]`` and the tokens of ``xq_rows``/``xd_rows`` (``_axes``-shaped), by the type's step."""
    if QTYPE == Q4_K or QTYPE == Q5_K:
        return _q45k_step(w_ptr, row_off, k0, xq_rows, xd_rows, QTYPE, TS, BK, DP4A)
    elif QTYPE == Q6_K:
        return _q6k_step(w_ptr, row_off, k0, xq_rows, xd_rows, TS, BK, DP4A)
    else:
        return _legacy_step(w_ptr, row_off, k0, xq_rows, xd_rows, QTYPE, TS, BK, DP4A)


@triton.jit
def _axes(v, AXES: tl.constexpr):
    """``v [BM]`` with ``AXES - 1`` trailing unit axes (the step functions' token-axis shape)."""
    if AXES == 4:
        return v[:, None, None, None]
    elif AXES == 5:
        return v[:, None, None, None, None]
    else:
        return v[:, None, None, None, None, None]
