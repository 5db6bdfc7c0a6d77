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
with an int8 scale each: one dot per 16-column half, the other half's weights zeroed). Results
equal ``W @ x_hat`` (``x_hat`` the int8-rounded activations) up to float32 summation order.

``mmq_tile`` is the K loop of one ``[BM, BN]`` tile; the dense kernel (``mmq_kernel``, tokens x rows)
and the grouped MoE kernel (``gguf_moe.triton_moe``, routes of one expert x that expert's rows) call
it with their own row pointers (Triton inlines it: one kernel's code, as if written in place).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .triton_words import Q4_0, Q4_K, Q5_K, Q8_0, _u16, half_bits

MMQ_TYPES = {"Q4_0": 32, "Q8_0": 32, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256}   # type -> columns of one block
MMQ_MIN_TYPES = frozenset({"Q4_K", "Q5_K"})   # types whose minimum term reads the activations' block sums


@triton.jit
def _k_scale_min(scales_ptr, s: tl.constexpr):
    """Q4_K's 6-bit scale and minimum of 32-block ``s`` (0..7) from its 12 packed bytes; ``scales_ptr [BN]``."""
    if s < 4:
        sc = tl.load(scales_ptr + s).to(tl.int32) & 63
        mn = tl.load(scales_ptr + s + 4).to(tl.int32) & 63
    else:
        hi = tl.load(scales_ptr + s + 4).to(tl.int32)
        sc = (hi & 15) | ((tl.load(scales_ptr + s - 4).to(tl.int32) >> 6) << 4)
        mn = (hi >> 4) | ((tl.load(scales_ptr + s).to(tl.int32) >> 6) << 4)
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def mmq_tile(x_rows, xd_rows, xs_rows, x_ok, row, part, part_cols, QTYPE: tl.constexpr, TS: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr):
    """float32 ``[BM, BN] = x_hat @ W.T`` over columns ``part * part_cols ..`` (``part_cols`` whole blocks).

    ``x_rows [BM, 32]``: pointers to columns 0..31 of each activation row's int8 quants (for Q4_0
    each block permuted: position 2i + h holds column i + 16h); ``xd_rows [BM]``, ``xs_rows [BM]``:
    pointers to each row's first float32 block scale and ``d * sum(q)`` (read for Q4_K/Q5_K only);
    ``x_ok [BM]``: the real rows (the others read as 0); ``row [BN]``: each weight row's packed bytes."""
    c = tl.arange(0, 32)
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
            isum = tl.dot(x, tl.trans(w), out_dtype=tl.int32)
            xd = tl.load(xd_rows + b, mask=x_ok, other=0.0)
            acc += isum.to(tl.float32) * xd[:, None] * d[None, :]
    else:
        first = part * (part_cols // 256)
        for sb in range(first, first + part_cols // 256):
            block = row + sb * TS
            if QTYPE == Q4_K or QTYPE == Q5_K:
                # Q4_K: d, dmin, scales[12], qs[128]; Q5_K: the same with qh[32] before qs. 32-block s
                # is nibble s % 2 of qs bytes 32 (s // 2) ..; Q5_K's fifth bit is bit s of qh[0..31].
                d = half_bits(_u16(block, 0))
                dmin = half_bits(_u16(block, 1))
                if QTYPE == Q5_K:
                    qh = tl.load(block[:, None] + 16 + c[None, :])              # [BN, 32]: one load per super-block
                    qs = block + 48
                else:
                    qs = block + 16
                for s in tl.static_range(8):
                    if s % 2 == 0:  # one load of 32 bytes serves 32-blocks s (low nibbles) and s + 1 (high)
                        byte = tl.load(qs[:, None] + 32 * (s // 2) + c[None, :])
                    if QTYPE == Q5_K:
                        w = (((byte >> (4 * (s % 2))) & 15) | (((qh >> s) & 1) << 4)).to(tl.int8)
                    else:
                        w = ((byte >> (4 * (s % 2))) & 15).to(tl.int8)
                    b = sb * 8 + s
                    x = tl.load(x_rows + b * 32, mask=x_ok[:, None], other=0)
                    isum = tl.dot(x, tl.trans(w), out_dtype=tl.int32)
                    sc, mn = _k_scale_min(block + 4, s)
                    xd = tl.load(xd_rows + b, mask=x_ok, other=0.0)
                    xs = tl.load(xs_rows + b, mask=x_ok, other=0.0)
                    acc += (isum.to(tl.float32) * xd[:, None] * (d * sc)[None, :]
                            - xs[:, None] * (dmin * mn)[None, :])
            else:  # Q6_K: ql[128], qh[64], scales[16] int8, d; 32-block s = quarter s % 4 of half s // 4
                d = half_bits(_u16(block, 104))
                low = c < 16
                for s in tl.static_range(8):
                    half, quarter = s // 4, s % 4
                    ql = tl.load(block[:, None] + 64 * half + 32 * (quarter % 2) + c[None, :]).to(tl.int32)
                    qh = tl.load(block[:, None] + 128 + 32 * half + c[None, :]).to(tl.int32)
                    q = (((ql >> (4 * (quarter // 2))) & 15) | (((qh >> (2 * quarter)) & 3) << 4)) - 32
                    w_low = tl.where(low[None, :], q, 0).to(tl.int8)
                    w_high = tl.where(low[None, :], 0, q).to(tl.int8)
                    b = sb * 8 + s
                    x = tl.load(x_rows + b * 32, mask=x_ok[:, None], other=0)
                    sum_low = tl.dot(x, tl.trans(w_low), out_dtype=tl.int32)
                    sum_high = tl.dot(x, tl.trans(w_high), out_dtype=tl.int32)
                    sc_ptr = block + 192 + 8 * half + 2 * quarter
                    sc_low = tl.load(sc_ptr.to(tl.pointer_type(tl.int8))).to(tl.float32)
                    sc_high = tl.load((sc_ptr + 1).to(tl.pointer_type(tl.int8))).to(tl.float32)
                    xd = tl.load(xd_rows + b, mask=x_ok, other=0.0)
                    acc += (sum_low.to(tl.float32) * sc_low[None, :] + sum_high.to(tl.float32) * sc_high[None, :]) \
                        * xd[:, None] * d[None, :]
    return acc


@triton.jit
def mmq_kernel(xq_ptr, xd_ptr, xs_ptr, w_ptr, out_ptr, tokens, rows, cols, split_cols, stride_w, stride_out,
               stride_split, QTYPE: tl.constexpr, TS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Program (row tile, token tile, K split): ``out[split, BM, BN] = x_hat @ W.T`` over its
    ``split_cols`` columns (whole blocks of the type).

    ``xq [T, cols]`` int8 (for Q4_0 each block permuted: position 2i + h holds column i + 16h),
    ``xd [T, cols / 32]`` float32 scales, ``xs [T, cols / 32]`` float32
    ``d * sum(q)`` per block (Q4_K's and Q5_K's minimum term); ``w [rows, row bytes]`` packed."""
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n = pid_n * BN + tl.arange(0, BN)
    m = pid_m * BM + tl.arange(0, BM)
    n_ok, m_ok = n < rows, m < tokens
    n = tl.where(n_ok, n, 0)                         # clamped rows load real bytes; their sums are dropped
    row = w_ptr + n.to(tl.int64) * stride_w          # [BN]
    x_rows = xq_ptr + m.to(tl.int64)[:, None] * cols + tl.arange(0, 32)[None, :]     # [BM, 32]
    blocks = cols // 32
    acc = mmq_tile(x_rows, xd_ptr + m * blocks, xs_ptr + m * blocks, m_ok, row, pid_k, split_cols, QTYPE, TS, BM, BN)
    out = out_ptr + pid_k * stride_split + m.to(tl.int64)[:, None] * stride_out + n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])
