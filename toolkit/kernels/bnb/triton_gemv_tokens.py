"""Token-unrolled GEMVs for bitsandbytes weights and 1 to 16 tokens: ``out[T, N] = x[T, K] @ W[N, K].T``,
each program reading its ``BN`` rows' packed bytes once for all tokens, one accumulator per token.

Why: the first bitsandbytes kernels (``triton_kernels``) took the tokens as a tensor axis: at 8 tokens
either ``tl.dot`` on a permuted, dequantized tile or a broadcast product reduced per K step, and the
4-bit one lost to bitsandbytes' dequantize + cuBLAS (14-92 against 12-44 us per TinyLlama matrix,
H100). Here, as in ``kernels/gguf/triton_gemv_tokens``, the tokens are unrolled in the code (``BM``, a
constexpr power of two, accumulators ``acc0..acc15``): every tensor has the weight tile's shape, a
weight is decoded once and costs one float32 FMA per token.

Tiles are ``[W, BN]`` 32-bit words: ``W = BK / 8`` (4-bit) or ``BK / 4`` (int8) words of each of ``BN``
rows, words first. That order is what Triton's layout passes give every tensor of the step (the
codebook gathers and activation loads have no contiguity, and ties put dimension 0 fastest), so on
sm_90 the K loop has no layout conversion and no shared memory; threads run along the words and
each holds all ``BN`` rows of its words, so one activation load serves ``BN`` rows. Each word
becomes 8 (4) float32 tensors of the tile's shape, its columns in order; the activations of those
columns are as many loads of shape ``[W, 1]``; each token's products chain into FMAs per word, and
(4-bit) the chain is scaled once per word and token by its block's absmax, never per weight.

4-bit (bitsandbytes' ``quantize_4bit`` layout): byte ``j`` of the flat weight holds element ``2j`` in its
high nibble and ``2j + 1`` in its low one; element ``e`` is ``code[nibble] * absmax[e // blocksize]``,
with double quantization ``absmax = code2[absmax_u8] * absmax2[b // blocksize2] + offset`` as
``dequantize_4bit`` computes it. Codebook lookups (``LUT``):

- ``LUT=16``: one float32 load per value from the 16-entry codebook (64 bytes, one cache line: a
  warp's gather is served at once); exact.
- ``LUT=256``: one 32-bit load per byte from a 256-entry table of the byte's two values as float16
  (``byte_table``): half the loads and index computations, but the table spans 8 cache lines, and the
  codebook is rounded to float16 (relative 2**-12, well under the bf16 rounding bitsandbytes applies
  to its dequantized weight). Which is faster is for ``bench/bench_bnb_kernels.py --sweep`` to say.

One launch may cover several segments of a fused projection (q/k/v, gate/up; ``NSEG`` up to 4) whose
statistics lie back to back (``Bnb4bitParameter.gather_statistics``): flat absmax indices run across
segments unchanged, and a row's segment (``R1..R3``: first rows of segments 1..3) picks its codebook
and, with double quantization, its nested codebook, ``offset`` and where its ``absmax2`` blocks start
(``A1..A3``, ``B1..B3``: first absmax2 block and first absmax block of segments 1..3).

int8 (``Int8Params``: ``CB [N, K]`` int8, ``SCB [N]`` float32, ``W = CB * SCB / 127``): weight-only, the
int8 values turned to float exactly, the row scale applied to each token's final sum.

K may be split over a second grid axis (``K_SPLIT`` columns per program); partial sums then go to a
float32 ``[SPLIT, T, N]`` buffer the caller reduces (``kernels/triton_reduce.sum_splits``).
"""
from __future__ import annotations

import triton
import triton.language as tl

MAX_TOKENS = 16       # accumulators the kernels unroll


@triton.jit
def _exact_float(v):
    """float32 of an integer 0 <= v < 2**23 with ALU ops only (v OR'd into 2**23's mantissa)."""
    return (v.to(tl.uint32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _half_value(bits):
    """The float16 in the low 16 bits of ``bits`` (uint32) as float32."""
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


# ---- 4-bit: decoding a step's words -------------------------------------------------------------

@triton.jit
def _nibble_values(words, code_ptr, LUT: tl.constexpr):
    """The 8 values of each word, in column order (element 2j: high nibble of byte j), unscaled."""
    if LUT == 16:
        v0 = tl.load(code_ptr + ((words >> 4) & 15))
        v1 = tl.load(code_ptr + (words & 15))
        v2 = tl.load(code_ptr + ((words >> 12) & 15))
        v3 = tl.load(code_ptr + ((words >> 8) & 15))
        v4 = tl.load(code_ptr + ((words >> 20) & 15))
        v5 = tl.load(code_ptr + ((words >> 16) & 15))
        v6 = tl.load(code_ptr + (words >> 28))
        v7 = tl.load(code_ptr + ((words >> 24) & 15))
    else:  # byte table: low half the byte's first (high-nibble) value, high half its second
        p0 = tl.load(code_ptr + (words & 255))
        p1 = tl.load(code_ptr + ((words >> 8) & 255))
        p2 = tl.load(code_ptr + ((words >> 16) & 255))
        p3 = tl.load(code_ptr + (words >> 24))
        v0, v1 = _half_value(p0), _half_value(p0 >> 16)
        v2, v3 = _half_value(p1), _half_value(p1 >> 16)
        v4, v5 = _half_value(p2), _half_value(p2 >> 16)
        v6, v7 = _half_value(p3), _half_value(p3 >> 16)
    return v0, v1, v2, v3, v4, v5, v6, v7


@triton.jit
def _segment_pick(rows, first, value, previous):
    """``value`` for rows at or past ``first``, else ``previous`` (segments are in row order)."""
    return tl.where(rows >= first, value, previous)


@triton.jit
def _segments(rows, R1, R2, R3, A1, A2, A3, B1, B2, B3, NSEG: tl.constexpr):
    """Per row: its segment, and where its segment's absmax2 and absmax blocks start."""
    seg = rows * 0
    a_start = rows * 0
    b_start = rows * 0
    if NSEG > 1:
        seg = _segment_pick(rows, R1, 1, seg)
        a_start = _segment_pick(rows, R1, A1, a_start)
        b_start = _segment_pick(rows, R1, B1, b_start)
    if NSEG > 2:
        seg = _segment_pick(rows, R2, 2, seg)
        a_start = _segment_pick(rows, R2, A2, a_start)
        b_start = _segment_pick(rows, R2, B2, b_start)
    if NSEG > 3:
        seg = _segment_pick(rows, R3, 3, seg)
        a_start = _segment_pick(rows, R3, A3, a_start)
        b_start = _segment_pick(rows, R3, B3, b_start)
    return seg, a_start, b_start


@triton.jit
def _word_scales(absmax_ptr, code2_ptr, absmax2_ptr, offset_ptr, rows, seg, a_start, b_start, cols, K,
                 BS: tl.constexpr, NB2: tl.constexpr, NESTED: tl.constexpr):
    """``[W, BN]`` float32: the absmax of each word's block, as ``dequantize_4bit`` computes it (``rows``,
    ``seg``, ``a_start``, ``b_start`` ``[1, BN]``; ``cols [W, 1]``: the words' first columns)."""
    block = rows * (K // BS) + cols // BS                                               # [W, BN]
    if NESTED:
        inner = a_start + (block - b_start) // NB2
        code2 = tl.load(code2_ptr + seg * 256 + tl.load(absmax_ptr + block).to(tl.int32))
        return code2 * tl.load(absmax2_ptr + inner) + tl.load(offset_ptr + seg)
    else:
        return tl.load(absmax_ptr + block)


# ---- activations and accumulation ---------------------------------------------------------------

@triton.jit
def _token_row(x_ptr, t: tl.constexpr, T, stride_x):
    """Token ``t``'s row (a padding token, ``t >= T``, re-reads the last one; its sums are never stored)."""
    return x_ptr + tl.minimum(T - 1, t).to(tl.int64) * stride_x


@triton.jit
def _token_rows(x_ptr, T, stride_x):
    """The rows of tokens 0..15 (``_token_row``): the kernels unroll up to 16 tokens."""
    return (_token_row(x_ptr, 0, T, stride_x), _token_row(x_ptr, 1, T, stride_x), _token_row(x_ptr, 2, T, stride_x),
            _token_row(x_ptr, 3, T, stride_x), _token_row(x_ptr, 4, T, stride_x), _token_row(x_ptr, 5, T, stride_x),
            _token_row(x_ptr, 6, T, stride_x), _token_row(x_ptr, 7, T, stride_x), _token_row(x_ptr, 8, T, stride_x),
            _token_row(x_ptr, 9, T, stride_x), _token_row(x_ptr, 10, T, stride_x), _token_row(x_ptr, 11, T, stride_x),
            _token_row(x_ptr, 12, T, stride_x), _token_row(x_ptr, 13, T, stride_x), _token_row(x_ptr, 14, T, stride_x),
            _token_row(x_ptr, 15, T, stride_x))


@triton.jit
def _x(x_row, cols, i: tl.constexpr):
    return tl.load(x_row + cols + i).to(tl.float32)


@triton.jit
def _fourbit_token(v0, v1, v2, v3, v4, v5, v6, v7, x_row, cols):
    """One token's ``[W, BN]`` products, summed over each word's 8 columns (an FMA chain)."""
    p = v0 * _x(x_row, cols, 0)
    p += v1 * _x(x_row, cols, 1)
    p += v2 * _x(x_row, cols, 2)
    p += v3 * _x(x_row, cols, 3)
    p += v4 * _x(x_row, cols, 4)
    p += v5 * _x(x_row, cols, 5)
    p += v6 * _x(x_row, cols, 6)
    p += v7 * _x(x_row, cols, 7)
    return p


@triton.jit
def _store(out_ptr, acc, t: tl.constexpr, T, N, pid_k, offs_n):
    total = tl.sum(acc, axis=0)
    out = out_ptr + (pid_k * T + t).to(tl.int64) * N + offs_n
    tl.store(out, total.to(out_ptr.dtype.element_ty), mask=(offs_n < N) & (t < T))


@triton.jit
def fourbit_tokens_kernel(x_ptr, w_ptr, absmax_ptr, code_ptr, code2_ptr, absmax2_ptr, offset_ptr, out_ptr,
                          T, N, K, K_SPLIT, stride_x, R1, R2, R3, A1, A2, A3, B1, B2, B3,
                          BS: tl.constexpr, NB2: tl.constexpr, NESTED: tl.constexpr, NSEG: tl.constexpr,
                          LUT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """``out[pid_k, t, n]`` for every token ``t < T <= BM``, ``BN`` rows per program; ``code_ptr``: each
    segment's 16-entry float32 codebook (``LUT=16``) or 256-entry byte table (``LUT=256``), back to back;
    ``code2_ptr``: each segment's 256-entry nested codebook, back to back; ``offset_ptr``: their offsets."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BN + tl.arange(0, BN)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)[None, :]        # tail rows re-read the last one, never stored
    seg, a_start, b_start = _segments(rows, R1, R2, R3, A1, A2, A3, B1, B2, B3, NSEG)
    code_rows = code_ptr + seg * LUT                                # each segment's codebook or byte table
    word = tl.arange(0, BK // 8)[:, None]                                                    # [W, 1]
    w_rows = w_ptr.to(tl.pointer_type(tl.uint32)) + rows * (K // 8) + word                   # [W, BN]
    acc0 = tl.zeros((BK // 8, BN), dtype=tl.float32)
    acc1, acc2, acc3, acc4, acc5, acc6, acc7 = acc0, acc0, acc0, acc0, acc0, acc0, acc0
    acc8, acc9, acc10, acc11, acc12, acc13, acc14, acc15 = acc0, acc0, acc0, acc0, acc0, acc0, acc0, acc0
    x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15 = _token_rows(x_ptr, T, stride_x)
    k_start = pid_k * K_SPLIT
    for k_step in range(0, K_SPLIT, BK):
        k0 = k_start + k_step
        words = tl.load(w_rows + k0 // 8)
        cols = k0 + word * 8                                                                  # [W, 1]
        scale = _word_scales(absmax_ptr, code2_ptr, absmax2_ptr, offset_ptr, rows, seg, a_start, b_start, cols, K,
                             BS, NB2, NESTED)
        v0, v1, v2, v3, v4, v5, v6, v7 = _nibble_values(words, code_rows, LUT)
        acc0 += scale * _fourbit_token(v0, v1, v2, v3, v4, v5, v6, v7, x0, cols)
        if BM > 1:
            acc1 += scale * _fourbit_token(v0, v1, v2, v3, v4, v5, v6, v7, x1, cols)
        if BM > 2:
            acc2 += scale * _fourbit_token(v0, v1, v2, v3, v4, v5, v6, v7, x2, cols)
            acc3 += scale * _fourbit_token(v0, v1, v2, v3, v4, v5, v6, v7, x3, cols)
        if BM > 4:
            acc4 += scale * _fourbit_token(v0, v1, v2, v3, v4, v5, v6, v7, x4, cols)
            acc5 += scale * _fourbit_token(v0, v1, v2, v3, v4, v5, v6, v7, x5, cols)
            acc6 += scale * _fourbit_token(v0, v1, v2, v3, v4, v5, v6, v7, x6, cols)
            acc7 += scale * _fourbit_token(v0, v1, v2, v3, v4, v5, v6, v7, x7, cols)
        if BM > 8:
            acc8 += scale * _fourbit_token(v0, v1, v2, v3, v4, v5, v6, v7, x8, cols)
            acc9 += scale * _fourbit_token(v0, v1, v2, v3, v4, v5, v6, v7, x9, cols)
            acc10 += scale * _fourbit_token(v0, v1, v2, v3, v4, v5, v6, v7, x10, cols)
            acc11 += scale * _fourbit_token(v0, v1, v2, v3, v4, v5, v6, v7, x11, cols)
            acc12 += scale * _fourbit_token(v0, v1, v2, v3, v4, v5, v6, v7, x12, cols)
            acc13 += scale * _fourbit_token(v0, v1, v2, v3, v4, v5, v6, v7, x13, cols)
            acc14 += scale * _fourbit_token(v0, v1, v2, v3, v4, v5, v6, v7, x14, cols)
            acc15 += scale * _fourbit_token(v0, v1, v2, v3, v4, v5, v6, v7, x15, cols)
    _store_all(out_ptr, T, N, pid_k, offs_n, BM, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7,
               acc8, acc9, acc10, acc11, acc12, acc13, acc14, acc15)


@triton.jit
def _store_all(out_ptr, T, N, pid_k, offs_n, BM: tl.constexpr, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7,
               acc8, acc9, acc10, acc11, acc12, acc13, acc14, acc15):
    _store(out_ptr, acc0, 0, T, N, pid_k, offs_n)
    if BM > 1:
        _store(out_ptr, acc1, 1, T, N, pid_k, offs_n)
    if BM > 2:
        _store(out_ptr, acc2, 2, T, N, pid_k, offs_n)
        _store(out_ptr, acc3, 3, T, N, pid_k, offs_n)
    if BM > 4:
        _store(out_ptr, acc4, 4, T, N, pid_k, offs_n)
        _store(out_ptr, acc5, 5, T, N, pid_k, offs_n)
        _store(out_ptr, acc6, 6, T, N, pid_k, offs_n)
        _store(out_ptr, acc7, 7, T, N, pid_k, offs_n)
    if BM > 8:
        _store(out_ptr, acc8, 8, T, N, pid_k, offs_n)
        _store(out_ptr, acc9, 9, T, N, pid_k, offs_n)
        _store(out_ptr, acc10, 10, T, N, pid_k, offs_n)
        _store(out_ptr, acc11, 11, T, N, pid_k, offs_n)
        _store(out_ptr, acc12, 12, T, N, pid_k, offs_n)
        _store(out_ptr, acc13, 13, T, N, pid_k, offs_n)
        _store(out_ptr, acc14, 14, T, N, pid_k, offs_n)
        _store(out_ptr, acc15, 15, T, N, pid_k, offs_n)


# ---- int8 ---------------------------------------------------------------------------------------

@triton.jit
def _byte_values(words):
    """The 4 signed bytes of each word as exact float32 (offset binary: (b ^ 128) - 128)."""
    return (_exact_float((words & 255) ^ 128) - 128.0, _exact_float(((words >> 8) & 255) ^ 128) - 128.0,
            _exact_float(((words >> 16) & 255) ^ 128) - 128.0, _exact_float((words >> 24) ^ 128) - 128.0)


@triton.jit
def _int8_token(v0, v1, v2, v3, x_row, cols):
    """One token's ``[BN, WPS]`` partial sums (4 FMAs per word), kept per word until the end."""
    p = v0 * _x(x_row, cols, 0)
    p += v1 * _x(x_row, cols, 1)
    p += v2 * _x(x_row, cols, 2)
    p += v3 * _x(x_row, cols, 3)
    return p


@triton.jit
def _int8_store(out_ptr, acc, scale, t: tl.constexpr, T, N, pid_k, offs_n):
    total = tl.sum(acc, axis=1) * scale
    out = out_ptr + (pid_k * T + t).to(tl.int64) * N + offs_n
    tl.store(out, total.to(out_ptr.dtype.element_ty), mask=(offs_n < N) & (t < T))


@triton.jit
def int8_tokens_kernel(x_ptr, w_ptr, scb_ptr, out_ptr, T, N, K, K_SPLIT, stride_x, stride_w,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """``out[pid_k, t, n]`` for every token ``t < T <= BM``; ``stride_w``: bytes between rows (a
    multiple of 4). Tiles ``[BN, BK / 4]`` words; accumulators of that shape, reduced once at the end."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BN + tl.arange(0, BN)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)
    WPS: tl.constexpr = BK // 4
    word = tl.arange(0, WPS)[None, :]
    w_rows = w_ptr.to(tl.pointer_type(tl.uint32)) + rows[:, None] * (stride_w // 4) + word
    acc0 = tl.zeros((BN, WPS), dtype=tl.float32)
    acc1, acc2, acc3, acc4, acc5, acc6, acc7 = acc0, acc0, acc0, acc0, acc0, acc0, acc0
    acc8, acc9, acc10, acc11, acc12, acc13, acc14, acc15 = acc0, acc0, acc0, acc0, acc0, acc0, acc0, acc0
    x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15 = _token_rows(x_ptr, T, stride_x)
    k_start = pid_k * K_SPLIT
    for k_step in range(0, K_SPLIT, BK):
        k0 = k_start + k_step
        v0, v1, v2, v3 = _byte_values(tl.load(w_rows + k0 // 4))
        cols = k0 + word * 4                                                                  # [1, WPS]
        acc0 += _int8_token(v0, v1, v2, v3, x0, cols)
        if BM > 1:
            acc1 += _int8_token(v0, v1, v2, v3, x1, cols)
        if BM > 2:
            acc2 += _int8_token(v0, v1, v2, v3, x2, cols)
            acc3 += _int8_token(v0, v1, v2, v3, x3, cols)
        if BM > 4:
            acc4 += _int8_token(v0, v1, v2, v3, x4, cols)
            acc5 += _int8_token(v0, v1, v2, v3, x5, cols)
            acc6 += _int8_token(v0, v1, v2, v3, x6, cols)
            acc7 += _int8_token(v0, v1, v2, v3, x7, cols)
        if BM > 8:
            acc8 += _int8_token(v0, v1, v2, v3, x8, cols)
            acc9 += _int8_token(v0, v1, v2, v3, x9, cols)
            acc10 += _int8_token(v0, v1, v2, v3, x10, cols)
            acc11 += _int8_token(v0, v1, v2, v3, x11, cols)
            acc12 += _int8_token(v0, v1, v2, v3, x12, cols)
            acc13 += _int8_token(v0, v1, v2, v3, x13, cols)
            acc14 += _int8_token(v0, v1, v2, v3, x14, cols)
            acc15 += _int8_token(v0, v1, v2, v3, x15, cols)
    scale = tl.load(scb_ptr + rows) * (1.0 / 127.0)
    _int8_store(out_ptr, acc0, scale, 0, T, N, pid_k, offs_n)
    if BM > 1:
        _int8_store(out_ptr, acc1, scale, 1, T, N, pid_k, offs_n)
    if BM > 2:
        _int8_store(out_ptr, acc2, scale, 2, T, N, pid_k, offs_n)
        _int8_store(out_ptr, acc3, scale, 3, T, N, pid_k, offs_n)
    if BM > 4:
        _int8_store(out_ptr, acc4, scale, 4, T, N, pid_k, offs_n)
        _int8_store(out_ptr, acc5, scale, 5, T, N, pid_k, offs_n)
        _int8_store(out_ptr, acc6, scale, 6, T, N, pid_k, offs_n)
        _int8_store(out_ptr, acc7, scale, 7, T, N, pid_k, offs_n)
    if BM > 8:
        _int8_store(out_ptr, acc8, scale, 8, T, N, pid_k, offs_n)
        _int8_store(out_ptr, acc9, scale, 9, T, N, pid_k, offs_n)
        _int8_store(out_ptr, acc10, scale, 10, T, N, pid_k, offs_n)
        _int8_store(out_ptr, acc11, scale, 11, T, N, pid_k, offs_n)
        _int8_store(out_ptr, acc12, scale, 12, T, N, pid_k, offs_n)
        _int8_store(out_ptr, acc13, scale, 13, T, N, pid_k, offs_n)
        _int8_store(out_ptr, acc14, scale, 14, T, N, pid_k, offs_n)
        _int8_store(out_ptr, acc15, scale, 15, T, N, pid_k, offs_n)
