"""Small-batch GGUF matmul on int8 tensor cores: 8-bit activations times the packed weights' integer
quants, one ``tl.dot`` per 32-column block, scales applied to the integer sums.

Why: for 2-64 tokens the float ``tl.dot`` kernel spends its time turning every weight into a
scaled float (shift, mask, convert, multiply), and above 16 tokens the dequantize-then-cuBLAS path
writes and re-reads the whole weight in 16 bits on every step. Here a weight becomes an int8 with
a shift and a mask; the activations are quantized once per step to int8 blocks of 32 (scale
``max|x| / 127``, as llama.cpp's q8_1), so a 32-column block of a row and a token is an exact
integer dot product, scaled once by ``d_w * d_x`` (and, for Q4_K's and Q5_K's minimum,
``dmin * m * sum x``).

Types: Q4_0, Q8_0 (blocks of 32, one scale), Q4_K and Q5_K (super-blocks of 256: eight 32-blocks
with a 6-bit scale and minimum each; Q5_K adds a fifth bit per weight) and Q6_K (sixteen 16-blocks
with an int8 scale each: one dot per 16-column half, the other half's activations masked off at the
load). Results equal ``W @ x_hat`` (``x_hat`` the int8-rounded activations) up to float32 summation order.

The K-quant weights are unpacked four to a 32-bit register with inline PTX (a shift and a mask per
four weights: ``nibbles``, ``nibbles_with_bit``, ``six_bits``); written element-wise, Triton widens
every byte to 16 bits and back (~8 instructions per weight). Their scales are read as whole words
once per super-block, all at the top of its iteration together with the tokens' block scales (Triton's
pipeliner stages only the loads that feed the dot). Under the interpreter (``ASM`` false) the same values
come from plain shifts.

``mmq_tile`` is the K loop of one ``[BM, BN]`` tile; the dense kernel (``mmq_kernel``, tokens x rows)
and the grouped MoE kernel (``gguf_moe.triton_moe``, routes of one expert x that expert's rows) call
it with their own row pointers (Triton inlines it: one kernel's code, as if written in place). With
``ROWS_FIRST`` the dots put the weight rows on the MMA's M side and the tokens on N, where 8 tokens fill
a tile (``_idot``; ``triton_ops.MMQ_ROWS_FIRST`` says which types).
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

from ..triton_pdl import wait_for_previous
from .triton_words import Q4_0, Q4_K, Q5_K, Q6_K, Q8_0, _u16, _u32, half_bits

# Packed-register unpacking through inline PTX on the GPU; Triton's interpreter (CPU) runs no PTX.
ASM = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")


@triton.jit
def _k_scale_min_words(sw0, sw1, sw2, s: tl.constexpr):
    """Q4_K's 6-bit scale and minimum of 32-block ``s`` (0..7) from its 12 packed scale bytes, given as
    three little-endian uint32 words ``[BN]`` (bytes 0-3, 4-7, 8-11)."""
    if s < 4:
        sc = (sw0 >> (8 * s)) & 63
        mn = (sw1 >> (8 * s)) & 63
    else:
        hi = sw2 >> (8 * (s - 4))
        sc = (hi & 15) | (((sw0 >> (8 * (s - 4) + 6)) & 3) << 4)
        mn = ((hi >> 4) & 15) | (((sw1 >> (8 * (s - 4) + 6)) & 3) << 4)
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def nibbles(byte, shift: tl.constexpr, ASM: tl.constexpr):
    """int8 ``(byte >> shift) & 15`` of a uint8 tensor. On the GPU four bytes share a 32-bit register, so one
    shift and one mask unpack four weights (the plain form compiles to per-byte 16-bit arithmetic and
    conversions: ~8 instructions per weight in this kernel's PTX); the interpreter takes the plain form."""
    if ASM:
        if shift == 0:
            return tl.inline_asm_elementwise("and.b32 $0, $1, 0x0F0F0F0F;", "=r,r", [byte], dtype=tl.int8,
                                             is_pure=True, pack=4)
        else:
            return tl.inline_asm_elementwise("{ .reg .b32 t; shr.b32 t, $1, 4; and.b32 $0, t, 0x0F0F0F0F; }",
                                             "=r,r", [byte], dtype=tl.int8, is_pure=True, pack=4)
    else:
        return ((byte >> shift) & 15).to(tl.int8)


@triton.jit
def nibbles_with_bit(byte, high, shift: tl.constexpr, bit: tl.constexpr, ASM: tl.constexpr):
    """int8 ``((byte >> shift) & 15) | (((high >> bit) & 1) << 4)`` (Q5_K's five-bit weights), four per register on
    the GPU (``nibbles``). A packed word shifted right by ``bit`` < 8 and masked per byte keeps each byte's own bit."""
    if ASM:
        if bit == 0:
            fifth = tl.inline_asm_elementwise("{ .reg .b32 t; shr.b32 t, $1, 0; and.b32 t, t, 0x01010101; shl.b32 $0, t, 4; }", "=r,r", [high], dtype=tl.int8,
                                                    is_pure=True, pack=4)
        elif bit == 1:
            fifth = tl.inline_asm_elementwise("{ .reg .b32 t; shr.b32 t, $1, 1; and.b32 t, t, 0x01010101; shl.b32 $0, t, 4; }", "=r,r", [high], dtype=tl.int8,
                                                    is_pure=True, pack=4)
        elif bit == 2:
            fifth = tl.inline_asm_elementwise("{ .reg .b32 t; shr.b32 t, $1, 2; and.b32 t, t, 0x01010101; shl.b32 $0, t, 4; }", "=r,r", [high], dtype=tl.int8,
                                                    is_pure=True, pack=4)
        elif bit == 3:
            fifth = tl.inline_asm_elementwise("{ .reg .b32 t; shr.b32 t, $1, 3; and.b32 t, t, 0x01010101; shl.b32 $0, t, 4; }", "=r,r", [high], dtype=tl.int8,
                                                    is_pure=True, pack=4)
        elif bit == 4:
            fifth = tl.inline_asm_elementwise("{ .reg .b32 t; shr.b32 t, $1, 4; and.b32 t, t, 0x01010101; shl.b32 $0, t, 4; }", "=r,r", [high], dtype=tl.int8,
                                                    is_pure=True, pack=4)
        elif bit == 5:
            fifth = tl.inline_asm_elementwise("{ .reg .b32 t; shr.b32 t, $1, 5; and.b32 t, t, 0x01010101; shl.b32 $0, t, 4; }", "=r,r", [high], dtype=tl.int8,
                                                    is_pure=True, pack=4)
        elif bit == 6:
            fifth = tl.inline_asm_elementwise("{ .reg .b32 t; shr.b32 t, $1, 6; and.b32 t, t, 0x01010101; shl.b32 $0, t, 4; }", "=r,r", [high], dtype=tl.int8,
                                                    is_pure=True, pack=4)
        else:
            fifth = tl.inline_asm_elementwise("{ .reg .b32 t; shr.b32 t, $1, 7; and.b32 t, t, 0x01010101; shl.b32 $0, t, 4; }", "=r,r", [high], dtype=tl.int8,
                                                    is_pure=True, pack=4)
        return nibbles(byte, shift, ASM) | fifth
    else:
        return (((byte >> shift) & 15) | (((high >> bit) & 1) << 4)).to(tl.int8)


@triton.jit
def _scale_word(ptr, i: tl.constexpr):
    """int32 of the four bytes at ``ptr + 4 i`` (``ptr`` 2-aligned), from two 16-bit loads."""
    return (_u16(ptr, 2 * i) | (_u16(ptr, 2 * i + 1) << 16)).to(tl.int32, bitcast=True)


@triton.jit
def _pick4(v0, v1, v2, v3, i: tl.constexpr):
    if i == 0:
        return v0
    elif i == 1:
        return v1
    elif i == 2:
        return v2
    else:
        return v3


@triton.jit
def six_bits(ql, qh, quarter: tl.constexpr, ASM: tl.constexpr):
    """Q6_K's int8 weights ``(((ql >> 4 (quarter // 2)) & 15) | (((qh >> 2 quarter) & 3) << 4)) - 32`` of uint8
    tensors, four per register on the GPU: the 6-bit value v gets -32 per byte without borrows as
    ``((v | 0x80) - 0x20) ^ 0x80``."""
    if ASM:
        if quarter == 0:
            return tl.inline_asm_elementwise("{ .reg .b32 t, h; and.b32 t, $1, 0x0F0F0F0F; and.b32 h, $2, 0x03030303; shl.b32 h, h, 4; " \
                  "or.b32 t, t, h; or.b32 t, t, 0x80808080; sub.u32 t, t, 0x20202020; xor.b32 $0, t, 0x80808080; }", "=r,r,r", [ql, qh], dtype=tl.int8,
                                             is_pure=True, pack=4)
        elif quarter == 1:
            return tl.inline_asm_elementwise("{ .reg .b32 t, h; and.b32 t, $1, 0x0F0F0F0F; shr.b32 h, $2, 2; and.b32 h, h, 0x03030303; " \
                  "shl.b32 h, h, 4; or.b32 t, t, h; or.b32 t, t, 0x80808080; sub.u32 t, t, 0x20202020; " \
                  "xor.b32 $0, t, 0x80808080; }", "=r,r,r", [ql, qh], dtype=tl.int8,
                                             is_pure=True, pack=4)
        elif quarter == 2:
            return tl.inline_asm_elementwise("{ .reg .b32 t, h; shr.b32 t, $1, 4; and.b32 t, t, 0x0F0F0F0F; shr.b32 h, $2, 4; " \
                  "and.b32 h, h, 0x03030303; shl.b32 h, h, 4; or.b32 t, t, h; or.b32 t, t, 0x80808080; " \
                  "sub.u32 t, t, 0x20202020; xor.b32 $0, t, 0x80808080; }", "=r,r,r", [ql, qh], dtype=tl.int8,
                                             is_pure=True, pack=4)
        else:
            return tl.inline_asm_elementwise("{ .reg .b32 t, h; shr.b32 t, $1, 4; and.b32 t, t, 0x0F0F0F0F; shr.b32 h, $2, 6; " \
                  "and.b32 h, h, 0x03030303; shl.b32 h, h, 4; or.b32 t, t, h; or.b32 t, t, 0x80808080; " \
                  "sub.u32 t, t, 0x20202020; xor.b32 $0, t, 0x80808080; }", "=r,r,r", [ql, qh], dtype=tl.int8,
                                             is_pure=True, pack=4)
    else:
        v = ((ql.to(tl.int32) >> (4 * (quarter // 2))) & 15) | (((qh.to(tl.int32) >> (2 * quarter)) & 3) << 4)
        return (v - 32).to(tl.int8)


@triton.jit
def _k_head(block, QTYPE: tl.constexpr):
    """A super-block's scale fields of each row ``[BN]`` (``block``: their super-blocks' first bytes), read as
    words (not 16-24 byte loads): Q4_K/Q5_K ``(d | dmin << 16, scale words 0-2)``, Q6_K ``(d, scale words 0-3)``
    (its 210-byte blocks are only 2-aligned: 16-bit loads)."""
    if QTYPE == Q6_K:
        return (_u16(block, 104), _scale_word(block + 192, 0), _scale_word(block + 192, 1),
                _scale_word(block + 192, 2), _scale_word(block + 192, 3))
    else:
        return _u32(block, 0), _u32(block + 4, 0), _u32(block + 4, 1), _u32(block + 4, 2)


@triton.jit
def _eight(ptrs, mask):
    """The float32 ``[BM]`` vectors at ``ptrs + 0 .. 7`` (masked rows read 0), as a tuple."""
    return (tl.load(ptrs, mask=mask, other=0.0), tl.load(ptrs + 1, mask=mask, other=0.0),
            tl.load(ptrs + 2, mask=mask, other=0.0), tl.load(ptrs + 3, mask=mask, other=0.0),
            tl.load(ptrs + 4, mask=mask, other=0.0), tl.load(ptrs + 5, mask=mask, other=0.0),
            tl.load(ptrs + 6, mask=mask, other=0.0), tl.load(ptrs + 7, mask=mask, other=0.0))


@triton.jit
def _token_scales(xd_rows, xs_rows, x_ok, sb, QTYPE: tl.constexpr):
    """The tokens' block scales ``[BM]`` of super-block ``sb``'s eight 32-blocks, then (Q4_K/Q5_K) their ``d *
    sum(q)``: a tuple of 8 or 16."""
    if QTYPE == Q6_K:
        return _eight(xd_rows + sb * 8, x_ok)
    else:
        return _eight(xd_rows + sb * 8, x_ok) + _eight(xs_rows + sb * 8, x_ok)


@triton.jit
def _idot(x, w, ROWS_FIRST: tl.constexpr):
    """int32 ``x [BM, 32] . w [BN, 32]`` per (token, row): ``[BN, BM]`` with ``ROWS_FIRST`` (the weight rows as
    the MMA's M side, 16 per instruction, the tokens as its N side, 8 per instruction), else ``[BM, BN]`` (the
    tokens as M: 8 tokens fill half of a 16-high tile, and the scaling after each dot does the padding's work)."""
    if ROWS_FIRST:
        return tl.dot(w, tl.trans(x), out_dtype=tl.int32)
    else:
        return tl.dot(x, tl.trans(w), out_dtype=tl.int32)


@triton.jit
def _rows(v, ROWS_FIRST: tl.constexpr):
    """A per-row ``[BN]`` vector broadcast along ``_idot``'s token axis."""
    if ROWS_FIRST:
        return v[:, None]
    else:
        return v[None, :]


@triton.jit
def _toks(v, ROWS_FIRST: tl.constexpr):
    """A per-token ``[BM]`` vector broadcast along ``_idot``'s row axis."""
    if ROWS_FIRST:
        return v[None, :]
    else:
        return v[:, None]


@triton.jit
def mmq_tile(x_rows, xd_rows, xs_rows, x_ok, row, part, part_cols, QTYPE: tl.constexpr, TS: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr, EVICT: tl.constexpr, ROWS_FIRST: tl.constexpr):
    """float32 ``[BM, BN] = x_hat @ W.T`` over columns ``part * part_cols ..`` (``part_cols`` whole blocks).

    ``x_rows [BM, 32]``: pointers to columns 0..31 of each activation row's int8 quants (for Q4_0
    each block permuted: position 2i + h holds column i + 16h); ``xd_rows [BM]``, ``xs_rows [BM]``:
    pointers to each row's first float32 block scale and ``d * sum(q)`` (read for Q4_K/Q5_K only);
    ``x_ok [BM]``: the real rows (the others read as 0); ``row [BN]``: each weight row's packed bytes;
    ``EVICT``: the L1 eviction policy of the K-quant weight loads ("" for the default); ``ROWS_FIRST``: the
    weight rows on the MMA's M side (``_idot``)."""
    c = tl.arange(0, 32)
    if ROWS_FIRST:
        acc = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    if QTYPE == Q4_0 or QTYPE == Q8_0:
        # The 2-aligned 18/34-byte blocks are read as uint16 words (byte loads would be twice the
        # instructions). Q4_0's element i is the low nibble of byte i (i < 16) or the high nibble of
        # byte i - 16; its weights are kept in the order (byte, nibble), and the caller passes x with
        # each block in that order too (``mmq_activations``: position 2i + h holds column i + 16h).
        first = part * (part_cols // 32)
        for b in range(first, first + part_cols // 32):
            block = row + b * TS
            d = half_bits(_u16(block, 0))                                       # [BN]
            if QTYPE == Q8_0:
                word = _u16(block[:, None] + 2, tl.arange(0, 16)[None, :])      # [BN, 16]
                w = tl.interleave(word & 255, word >> 8).to(tl.uint8).to(tl.int8, bitcast=True)   # [BN, 32]
            else:
                word = _u16(block[:, None] + 2, tl.arange(0, 8)[None, :])       # [BN, 8]
                byte = tl.interleave(word & 255, word >> 8)                      # [BN, 16]
                w = (tl.reshape(tl.join(byte & 15, byte >> 4), (BN, 32)).to(tl.int8) - 8).to(tl.int8)
            x = tl.load(x_rows + b * 32, mask=x_ok[:, None], other=0)
            isum = _idot(x, w, ROWS_FIRST)
            xd = tl.load(xd_rows + b, mask=x_ok, other=0.0)
            acc += isum.to(tl.float32) * _toks(xd, ROWS_FIRST) * _rows(d, ROWS_FIRST)
    else:
        first = part * (part_cols // 256)
        for sb in range(first, first + part_cols // 256):
            block = row + sb * TS
            # The super-block's scale words and its eight 32-blocks' token scales are plain loads (Triton
            # stages only the quants and activations): all issued here, at the top, so that their latencies
            # overlap (issued where each is used, each stalled its 32-block; loaded a super-block ahead, the
            # registers they held cost more than the latency they hid: docs/benchmarks.md, session 13).
            head = _k_head(block, QTYPE)
            tok = _token_scales(xd_rows, xs_rows, x_ok, sb, QTYPE)
            if QTYPE == Q4_K or QTYPE == Q5_K:
                # Q4_K: d, dmin, scales[12], qs[128]; Q5_K: the same with qh[32] before qs. 32-block s
                # is nibble s % 2 of qs bytes 32 (s // 2) ..; Q5_K's fifth bit is bit s of qh[0..31].
                d, dmin = half_bits(head[0]), half_bits(head[0] >> 16)
                sw0, sw1, sw2 = head[1], head[2], head[3]     # the 12 scale bytes as three words
                if QTYPE == Q5_K:
                    qh = tl.load(block[:, None] + 16 + c[None, :])              # [BN, 32]: one load per super-block
                    qs = block + 48
                else:
                    qs = block + 16
                for s in tl.static_range(8):
                    if s % 2 == 0:  # one load of 32 bytes serves 32-blocks s (low nibbles) and s + 1 (high)
                        byte = tl.load(qs[:, None] + 32 * (s // 2) + c[None, :], eviction_policy=EVICT)
                    if QTYPE == Q5_K:
                        w = nibbles_with_bit(byte, qh, 4 * (s % 2), s, ASM)
                    else:
                        w = nibbles(byte, 4 * (s % 2), ASM)
                    b = sb * 8 + s
                    x = tl.load(x_rows + b * 32, mask=x_ok[:, None], other=0)
                    isum = _idot(x, w, ROWS_FIRST)
                    sc, mn = _k_scale_min_words(sw0, sw1, sw2, s)
                    xd = tok[s]
                    nxs = -tok[8 + s]
                    # acc += isum * xd * (d sc) - xs * (dmin mn): a convert, a multiply and two fused
                    # multiply-adds per output (the [BM, BN] tile's work is per 32 columns)
                    acc = tl.fma(isum.to(tl.float32) * _toks(xd, ROWS_FIRST), _rows(d * sc, ROWS_FIRST), acc)
                    acc = tl.fma(_toks(nxs, ROWS_FIRST), _rows(dmin * mn, ROWS_FIRST), acc)
            else:  # Q6_K: ql[128], qh[64], scales[16] int8, d; 32-block s = quarter s % 4 of half s // 4
                d = half_bits(head[0])
                sw0, sw1, sw2, sw3 = head[1], head[2], head[3], head[4]   # the 16 int8 scales as four words
                low = c < 16
                for s in tl.static_range(8):
                    if s % 4 == 0:  # quarters 0 and 2 share ql bytes 0..31 of the half, 1 and 3 bytes 32..63
                        ql_even = tl.load(block[:, None] + 64 * (s // 4) + c[None, :], eviction_policy=EVICT)
                        ql_odd = tl.load(block[:, None] + 64 * (s // 4) + 32 + c[None, :], eviction_policy=EVICT)
                        qh = tl.load(block[:, None] + 128 + 32 * (s // 4) + c[None, :], eviction_policy=EVICT)
                    if s % 2 == 0:
                        w = six_bits(ql_even, qh, s % 4, ASM)
                    else:
                        w = six_bits(ql_odd, qh, s % 4, ASM)
                    b = sb * 8 + s
                    # the two 16-column halves have their own scales: two dots, each with the other half of
                    # the activations masked off at the load (no per-weight select)
                    x_low = tl.load(x_rows + b * 32, mask=x_ok[:, None] & low[None, :], other=0)
                    x_high = tl.load(x_rows + b * 32, mask=x_ok[:, None] & (c >= 16)[None, :], other=0)
                    sum_low = _idot(x_low, w, ROWS_FIRST)
                    sum_high = _idot(x_high, w, ROWS_FIRST)
                    word = _pick4(sw0, sw1, sw2, sw3, 2 * (s // 4) + (s % 4) // 2)
                    sc_low = (word << (24 - 16 * (s % 2))) >> 24           # signed bytes 2 (s % 2), + 1
                    sc_high = (word << (16 - 16 * (s % 2))) >> 24
                    isum = sum_low * _rows(sc_low, ROWS_FIRST) + sum_high * _rows(sc_high, ROWS_FIRST)   # < 2**24
                    xd = tok[s]
                    acc = tl.fma(isum.to(tl.float32) * _toks(xd, ROWS_FIRST), _rows(d, ROWS_FIRST), acc)
    if ROWS_FIRST:
        acc = tl.trans(acc)
    return acc


@triton.jit
def mmq_kernel(xq_ptr, xd_ptr, xs_ptr, w_ptr, out_ptr, tokens, rows, cols, split_cols, stride_w, stride_out,
               stride_split, QTYPE: tl.constexpr, TS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               EVICT: tl.constexpr = "", PDL: tl.constexpr = False, ROWS_FIRST: tl.constexpr = False):
    """Program (row tile, token tile, K split): ``out[split, BM, BN] = x_hat @ W.T`` over its
    ``split_cols`` columns (whole blocks of the type). ``PDL``: ``kernels/triton_pdl``.

    ``ROWS_FIRST``: the weight rows on the MMA's M side (``_idot``).

    ``xq [T, cols]`` int8 (for Q4_0 each block permuted: position 2i + h holds column i + 16h),
    ``xd [T, cols / 32]`` float32 scales, ``xs [T, cols / 32]`` float32
    ``d * sum(q)`` per block (Q4_K's and Q5_K's minimum term); ``w [rows, row bytes]`` packed."""
    wait_for_previous(PDL, LAUNCH_NEXT=False)
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n = pid_n * BN + tl.arange(0, BN)
    m = pid_m * BM + tl.arange(0, BM)
    n_ok, m_ok = n < rows, m < tokens
    n = tl.where(n_ok, n, 0)                         # clamped rows load real bytes; their sums are dropped
    row = w_ptr + n.to(tl.int64) * stride_w          # [BN]
    x_rows = xq_ptr + m.to(tl.int64)[:, None] * cols + tl.arange(0, 32)[None, :]     # [BM, 32]
    blocks = cols // 32
    acc = mmq_tile(x_rows, xd_ptr + m * blocks, xs_ptr + m * blocks, m_ok, row, pid_k, split_cols, QTYPE, TS, BM, BN,
                   EVICT, ROWS_FIRST)
    out = out_ptr + pid_k * stride_split + m.to(tl.int64)[:, None] * stride_out + n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])
