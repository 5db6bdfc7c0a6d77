"""Word-wise Triton tiles for the matmul: unpack packed GGUF rows a whole word at a time.

Why: unpacking element by element (``triton_tiles``) costs ~20-40 instructions per weight
(a byte load, 64-bit address arithmetic and a slow int->float conversion each), which makes
a decode GEMV instruction-bound. Here each thread loads whole 16/32-bit words (vectorized
where the block alignment allows), turns every bit field of its words into a float with a
shift, a mask and the 2**23 trick (ALU only), and keeps the fields in its own registers
(``tl.join`` adds a register-minor dimension). Scales are read once per (row, sub-block).

Each tile returns ``(w, x)``: weights ``[BN, *S]`` in the packed (field-minor) order and the
matching activations ``[BM, *S]``, loaded in natural order and permuted to the same order. A
dot product does not depend on the order of its terms, so both reshape to ``[*, BK]``.
Values equal ggml's float32 formula (up to a fused multiply-add).
"""
from __future__ import annotations

import triton
import triton.language as tl

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL = (tl.constexpr(v) for v in (2, 3, 6, 7, 8, 20))
Q4_K, Q5_K, Q6_K = (tl.constexpr(v) for v in (12, 13, 14))


@triton.jit
def exact_float(v):
    """float32 of an integer 0 <= v < 2**23, exactly: v OR'd into the mantissa of 2**23."""
    return (v.to(tl.uint32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def half_bits(v):
    """float32 of the fp16 whose bits are the low 16 bits of ``v``."""
    return (v & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def load_u16(ptr, index, EVICT: tl.constexpr):
    """uint16 words at byte address ``ptr`` (2-aligned) plus ``index`` words, widened to uint32; ``EVICT``:
    the loads' L1 eviction policy ("" the default; a constexpr argument, not a default value: Triton 3.6
    rejects a string default on a called jit function)."""
    return tl.load(ptr.to(tl.pointer_type(tl.uint16)) + index, eviction_policy=EVICT).to(tl.uint32)


@triton.jit
def load_u32(ptr, index, EVICT: tl.constexpr):
    return tl.load(ptr.to(tl.pointer_type(tl.uint32)) + index, eviction_policy=EVICT)


@triton.jit
def _u16(ptr, index):
    """``load_u16`` with the default eviction policy."""
    return load_u16(ptr, index, "")


@triton.jit
def _u32(ptr, index):
    return load_u32(ptr, index, "")


@triton.jit
def _join4(v0, v1, v2, v3):
    """``[..., 2, 2]`` with ``[..., a, b] = v[a + 2b]`` (all in the caller's registers)."""
    return tl.join(tl.join(v0, v1), tl.join(v2, v3))


@triton.jit
def _x_natural(x_rows, x_mask, k0, BM: tl.constexpr, BK: tl.constexpr):
    return tl.load(x_rows + k0 + tl.arange(0, BK)[None, :], mask=x_mask, other=0.0)        # [BM, BK]


@triton.jit
def q8_0_tile(w_ptr, row_off, k0, x_rows, x_mask, TS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr):
    """uint16 word w of a block holds elements 2w (low byte) and 2w + 1: natural order."""
    G: tl.constexpr = BK // 32
    g = tl.arange(0, G)[None, :, None]
    block = w_ptr + row_off[:, None, None] + (k0 // 32 + g) * TS                     # [BN, G, 1]
    d = half_bits(_u16(block, 0))
    words = _u16(block + 2, tl.arange(0, 16)[None, None, :])                         # [BN, G, 16]
    low = (exact_float((words & 255) ^ 128) - 128.0) * d                            # int8 as offset binary
    high = (exact_float((words >> 8) ^ 128) - 128.0) * d
    x = tl.reshape(_x_natural(x_rows, x_mask, k0, BM, BK), (BM, G, 16, 2))
    return tl.join(low, high), x


@triton.jit
def nibble32_tile(w_ptr, row_off, k0, x_rows, x_mask, table_ptr, QTYPE: tl.constexpr, TS: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL: byte b of uint16 word w holds elements 2w + b (low nibble)
    and 16 + 2w + b (high nibble). Tile ``[BN, G, 8, 2 (byte), 2 (high)]``."""
    G: tl.constexpr = BK // 32
    g = tl.arange(0, G)[None, :, None]
    w = tl.arange(0, 8)[None, None, :]
    block = w_ptr + row_off[:, None, None] + (k0 // 32 + g) * TS
    d = half_bits(_u16(block, 0))
    if QTYPE == Q4_0 or QTYPE == IQ4_NL:
        words = _u16(block + 2, w)
    elif QTYPE == Q4_1:
        words = _u16(block + 4, w)
    elif QTYPE == Q5_0:
        words = _u16(block + 6, w)
    else:
        words = _u16(block + 8, w)
    q0, q1, q2, q3 = words & 15, (words >> 8) & 15, (words >> 4) & 15, (words >> 12) & 15
    if QTYPE == Q5_0 or QTYPE == Q5_1:  # qh bit e is the fifth bit of element e
        if QTYPE == Q5_0:
            qh = _u16(block + 2, 0) | (_u16(block + 2, 1) << 16)
        else:
            qh = _u16(block + 4, 0) | (_u16(block + 4, 1) << 16)
        q0 = q0 | (((qh >> (2 * w)) & 1) << 4)
        q1 = q1 | (((qh >> (2 * w + 1)) & 1) << 4)
        q2 = q2 | (((qh >> (2 * w + 16)) & 1) << 4)
        q3 = q3 | (((qh >> (2 * w + 17)) & 1) << 4)
    if QTYPE == IQ4_NL:
        v = _join4(tl.load(table_ptr + q0), tl.load(table_ptr + q1), tl.load(table_ptr + q2),
                   tl.load(table_ptr + q3)) * d[:, :, :, None, None]
    else:
        v = _join4(exact_float(q0), exact_float(q1), exact_float(q2), exact_float(q3))
        dd = d[:, :, :, None, None]
        if QTYPE == Q4_0:
            v = dd * (v - 8.0)
        elif QTYPE == Q5_0:
            v = dd * (v - 16.0)
        elif QTYPE == Q4_1:
            v = dd * v + half_bits(_u16(block + 2, 0))[:, :, :, None, None]
        else:
            v = dd * v + half_bits(_u16(block + 2, 0))[:, :, :, None, None]
    x = tl.reshape(_x_natural(x_rows, x_mask, k0, BM, BK), (BM, G, 2, 8, 2))            # [m, g, high, w, b]
    return v, tl.permute(x, (0, 1, 3, 4, 2))


@triton.jit
def _k_scale_min(words0, words1, words2, s):
    """Q4_K/Q5_K 6-bit scale and min of sub-block(s) ``s``, from the 12 scale bytes as 3 words."""
    t = 8 * (s % 4)
    lo, mid, hi = (words0 >> t) & 255, (words1 >> t) & 255, (words2 >> t) & 255
    first = s < 4
    scale = tl.where(first, lo & 63, (hi & 15) | ((lo >> 6) << 4))
    minimum = tl.where(first, mid & 63, (hi >> 4) | ((mid >> 6) << 4))
    return exact_float(scale), exact_float(minimum)


@triton.jit
def _q45k_field(words, qh, shift, qh_shift, dl, ml, QTYPE: tl.constexpr):
    q = (words >> shift) & 15
    if QTYPE == Q5_K:
        q = q | (((qh >> qh_shift) & 1) << 4)
    return dl * exact_float(q) - ml


@triton.jit
def q45k_tile(w_ptr, row_off, k0, x_rows, x_mask, QTYPE: tl.constexpr, TS: tl.constexpr, BM: tl.constexpr,
              BN: tl.constexpr, BK: tl.constexpr):
    """Q4_K/Q5_K (16-aligned super-blocks): G groups of 64 elements, 8 uint32 words each; byte b,
    nibble h of word w in group g (of its super-block) is element 64g + 32h + 4w + b, of
    sub-block 2g + h. Headers and scales are read per group (a tile may span super-blocks).
    Tile ``[BN, G, 8, 2 (h), 2 (b & 1), 2 (b >> 1)]``."""
    G: tl.constexpr = BK // 64
    group = (k0 % 256) // 64 + tl.arange(0, G)[None, :, None]   # may run into the next super-block
    g = group % 4
    w = tl.arange(0, 8)[None, None, :]
    sb = w_ptr + row_off[:, None, None] + (k0 // 256 + group // 4) * TS               # [BN, G, 1]
    header = _u32(sb, 0)
    d, dmin = half_bits(header), half_bits(header >> 16)
    words0, words1, words2 = _u32(sb + 4, 0), _u32(sb + 4, 1), _u32(sb + 4, 2)
    scale0, min0 = _k_scale_min(words0, words1, words2, 2 * g)
    scale1, min1 = _k_scale_min(words0, words1, words2, 2 * g + 1)
    dl0, ml0, dl1, ml1 = d * scale0, dmin * min0, d * scale1, dmin * min1
    if QTYPE == Q4_K:
        words = _u32(sb + 16, 8 * g + w)
        qh = words
    else:
        words = _u32(sb + 48, 8 * g + w)
        qh = _u32(sb + 16, w)                 # bit 2g + h of byte b: fifth bit of element b, h
    v = tl.join(_join4(_q45k_field(words, qh, 0, 2 * g, dl0, ml0, QTYPE),
                       _q45k_field(words, qh, 4, 2 * g + 1, dl1, ml1, QTYPE),
                       _q45k_field(words, qh, 8, 2 * g + 8, dl0, ml0, QTYPE),
                       _q45k_field(words, qh, 12, 2 * g + 9, dl1, ml1, QTYPE)),
                _join4(_q45k_field(words, qh, 16, 2 * g + 16, dl0, ml0, QTYPE),
                       _q45k_field(words, qh, 20, 2 * g + 17, dl1, ml1, QTYPE),
                       _q45k_field(words, qh, 24, 2 * g + 24, dl0, ml0, QTYPE),
                       _q45k_field(words, qh, 28, 2 * g + 25, dl1, ml1, QTYPE)))
    x = tl.reshape(_x_natural(x_rows, x_mask, k0, BM, BK), (BM, G, 2, 8, 2, 2))         # [m, g, h, w, b1, b0]
    return v, tl.permute(x, (0, 1, 3, 2, 5, 4))


@triton.jit
def _q6k_field(low_words, high_words, low_shift, high_shift, dl):
    q = ((low_words >> low_shift) & 15) | (((high_words >> high_shift) & 3) << 4)
    return dl * (exact_float(q) - 32.0)


@triton.jit
def q6k_tile(w_ptr, row_off, k0, x_rows, x_mask, TS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
             BK: tl.constexpr):
    """Q6_K (2-aligned super-blocks): G halves of 128 elements; byte b, nibble n of ql word
    w = 8 * w1 + w2 is element 64n + 2w + b of the half, scale 4n + w1 of the half.
    Tile ``[BN, G, 4, 8, 2 (b), 2 (n)]``."""
    G: tl.constexpr = BK // 128
    half = (k0 % 256) // 128 + tl.arange(0, G)[None, :, None, None]   # may run into the next super-block
    g = half % 2
    w1 = tl.arange(0, 4)[None, None, :, None]
    w = 8 * w1 + tl.arange(0, 8)[None, None, None, :]
    sb = w_ptr + row_off[:, None, None, None] + (k0 // 256 + half // 2) * TS        # [BN, G, 1, 1]
    low = _u16(sb, 32 * g + w)
    high = _u16(sb + 128, 16 * g + w % 16)   # 2 bits of element e at byte e % 32, shift 2 * (e // 32)
    d = half_bits(_u16(sb + 208, 0))
    dl0 = d * tl.load(sb + 192 + 8 * g + w1).to(tl.int8, bitcast=True).to(tl.float32)       # [BN, G, 4, 1]
    dl1 = d * tl.load(sb + 196 + 8 * g + w1).to(tl.int8, bitcast=True).to(tl.float32)
    hs = 2 * (w // 16)
    v = _join4(_q6k_field(low, high, 0, hs, dl0), _q6k_field(low, high, 8, hs + 8, dl0),
               _q6k_field(low, high, 4, hs + 4, dl1), _q6k_field(low, high, 12, hs + 12, dl1))
    x = tl.reshape(_x_natural(x_rows, x_mask, k0, BM, BK), (BM, G, 2, 4, 8, 2))         # [m, g, n, w1, w2, b]
    return v, tl.permute(x, (0, 1, 3, 4, 5, 2))
