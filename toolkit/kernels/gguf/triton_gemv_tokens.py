"""dp4a GEMV for a few tokens (1 to 8): each step's weight words are loaded and unpacked once, then
dotted with every token's int8 activations, one accumulator per token.

Why: the first dp4a GEMV took its tokens as a leading tensor axis of the ``triton_dp4a`` step functions;
at 8 tokens it took 95-195 us per 4096x14336 weight (H100) and lost to the float ``tl.dot`` kernel. Here the tokens are
unrolled in the code (``BM`` is a constexpr, one accumulator tensor per token), so every tensor has
the weight tile's shape: a word is read once and costs one dp4a per token, the way llama.cpp's CUDA
GEMV serves up to 8 columns.

Per-word work is also trimmed for the tokens' sake: Q4_0, Q5_0 and Q6_K weights become signed bytes
once per word (``_signed``: three operations, instead of one activation-sum dp4a per word and
token), and Q4_K/Q5_K's minimum terms read the per-block activation sums ``quantize_activations``
writes (``SUMS``). Numbers: the same as ``triton_dp4a`` (exact integer sums, activations rounded to
int8 per 32-block), up to float32 summation order.

``DP4A=False`` computes the same sums with shifts and multiplies (the Triton interpreter on a CPU).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .triton_dp4a import LOW2, LOW4, ONES, Q4_0, Q4_K, Q5_K, Q6_K, Q8_0, _spread_bits, dp4a, load_u32_from_u16
from ..triton_pdl import TRITON_GEMV_EARLY_LAUNCH, wait_for_previous
from .triton_words import _k_scale_min, half_bits, load_u16, load_u32

HIGH: tl.constexpr = tl.constexpr(0x80808080)
MAX_TOKENS = 8        # accumulators the kernel unrolls


@triton.jit
def _signed(v, offset: tl.constexpr):
    """Bytes ``v - offset`` as signed bytes, for bytes 0 <= v < 128 and offsets < 128 (no borrows:
    bit 7 is set first, then flipped back)."""
    return ((v | HIGH) - offset * ONES) ^ HIGH


@triton.jit
def _halves(v):
    """``v [..., 2n]`` -> two ``[..., n]`` (even and odd positions): register renaming, no instructions."""
    return tl.split(tl.reshape(v, v.shape[:-1] + (v.shape[-1] // 2, 2)))


@triton.jit
def _chain4(w, x, acc, DP4A: tl.constexpr):
    w0, w1 = _halves(w)
    x0, x1 = _halves(x)
    w00, w01 = _halves(w0)
    w10, w11 = _halves(w1)
    x00, x01 = _halves(x0)
    x10, x11 = _halves(x1)
    if acc is None:
        acc = w00 & 0                     # zeros of the sums' shape [..., 1] (folded to a constant)
    return dp4a(w11, x11, dp4a(w10, x10, dp4a(w01, x01, dp4a(w00, x00, acc, DP4A), DP4A), DP4A), DP4A)


@triton.jit
def _dot_words(w, x, acc, DP4A: tl.constexpr):
    """``acc + sum over the last axis (4 words) of dp4a(w, x)`` as one chain of dp4a, each adding into
    the previous (no separate adds); ``acc [..., 1]`` int32, or None for zeros. Only where the 4 words
    sit in one thread (Q4_0/Q5_0's half blocks): splitting an axis spread over threads costs shuffles."""
    w, x = tl.broadcast(w.to(tl.int32, bitcast=True), x.to(tl.int32, bitcast=True))
    return _chain4(w, x, acc, DP4A)


@triton.jit
def _dot_sum(w, x, DP4A: tl.constexpr):
    """``sum over the last axis of dp4a(w, x)`` (keeping it, size 1): dp4a per word, then a sum."""
    w, x = tl.broadcast(w.to(tl.int32, bitcast=True), x.to(tl.int32, bitcast=True))
    return tl.sum(dp4a(w, x, tl.zeros(w.shape, tl.int32), DP4A), axis=len(w.shape) - 1, keep_dims=True)


# ---- Q4_0 / Q5_0 / Q8_0: tensors [BN, G, words] (row, 32-block, word of the block)

@triton.jit
def _legacy_raw(w_ptr, row_off, k0, QTYPE: tl.constexpr, TS: tl.constexpr, BK: tl.constexpr,
                EVICT: tl.constexpr):
    """The step's packed fields as loaded: ``(d bits [BN, G, 1], quant words, Q5_0's high-bit word)``."""
    g = tl.arange(0, BK // 32)[None, :, None]
    block = w_ptr + row_off[:, None, None] + (k0 // 32 + g) * TS                           # [BN, G, 1]
    d = load_u16(block, 0, EVICT)
    i = tl.arange(0, 4)[None, None, :]
    if QTYPE == Q8_0:
        return d, load_u32_from_u16(block + 2, tl.arange(0, 8)[None, None, :], EVICT), d
    elif QTYPE == Q4_0:
        return d, load_u32_from_u16(block + 2, i, EVICT), d
    else:
        return d, load_u32_from_u16(block + 6, i, EVICT), load_u32_from_u16(block + 2, 0 * i, EVICT)


@triton.jit
def _legacy_weights(raw, QTYPE: tl.constexpr):
    """``(d, lo, hi)``: block scales ``[BN, G, 1]`` and signed-byte words; Q8_0's 8 words of a block are
    ``lo`` (``hi`` repeats it), Q4_0/Q5_0's columns 4i.. in ``lo [BN, G, 4]`` and 16 + 4i.. in ``hi``."""
    d_bits, w, qh = raw
    d = half_bits(d_bits)
    if QTYPE == Q8_0:
        return d, w, w
    elif QTYPE == Q4_0:
        return d, _signed(w & LOW4, 8), _signed((w >> 4) & LOW4, 8)
    else:
        i = tl.arange(0, 4)[None, None, :]                             # bit j of qh: fifth bit of column j
        lo = _signed((w & LOW4) | _spread_bits((qh >> (4 * i)) & 15), 16)
        hi = _signed(((w >> 4) & LOW4) | _spread_bits((qh >> (16 + 4 * i)) & 15), 16)
        return d, lo, hi


@triton.jit
def _legacy_token(d, lo, hi, xq_row, xd_row, k0, QTYPE: tl.constexpr, BK: tl.constexpr, DP4A: tl.constexpr):
    """One token's ``[BN, G, 1]`` block sums (float32) against the unpacked weights."""
    g = tl.arange(0, BK // 32)[None, :, None]
    x_word = xq_row + k0 // 4 + 8 * g                                                       # [1, G, 1]
    xd = tl.load(xd_row + k0 // 32 + g)
    if QTYPE == Q8_0:
        x = tl.load(x_word + tl.arange(0, 8)[None, None, :])
        isum = _dot_sum(lo, x, DP4A)
    else:
        i = tl.arange(0, 4)[None, None, :]
        x_lo, x_hi = tl.load(x_word + i), tl.load(x_word + 4 + i)
        isum = _dot_words(hi, x_hi, _dot_words(lo, x_lo, None, DP4A), DP4A)
    return d * xd * isum.to(tl.float32)


# ---- Q4_K / Q5_K: tensors [BN, G, 4, 8] (row, super-block, 64-column group, word)

@triton.jit
def _q45k_raw(w_ptr, row_off, k0, QTYPE: tl.constexpr, TS: tl.constexpr, BK: tl.constexpr,
              EVICT: tl.constexpr):
    """The step's packed words as loaded: header ``(d, dmin)`` and the 3 scale words ``[BN, G, 1, 1]``, the
    quant words ``[BN, G, 4, 8]``, and Q5_K's high-bit words ``[BN, G, 1, 8]`` (Q4_K: the quants again)."""
    s = tl.arange(0, BK // 256)[None, :, None, None]
    j = tl.arange(0, 4)[None, None, :, None]
    i = tl.arange(0, 8)[None, None, None, :]
    sb = w_ptr + row_off[:, None, None, None] + (k0 // 256 + s) * TS                        # [BN, G, 1, 1]
    header = load_u32(sb, 0, EVICT)
    words0, words1 = load_u32(sb + 4, 0, EVICT), load_u32(sb + 4, 1, EVICT)
    words2 = load_u32(sb + 4, 2, EVICT)
    if QTYPE == Q4_K:
        w = load_u32(sb + 16, 8 * j + i, EVICT)
        return header, words0, words1, words2, w, w
    else:
        quants, high = load_u32(sb + 48, 8 * j + i, EVICT), load_u32(sb + 16, i, EVICT)
        return header, words0, words1, words2, quants, high


@triton.jit
def _q45k_weights(raw, QTYPE: tl.constexpr):
    """``(d * scale, dmin * min)`` of each group's low and high 32-block ``[BN, G, 4, 1]``, and the
    group's low/high quants ``[BN, G, 4, 8]`` (bytes 0..15, or 0..31 for Q5_K)."""
    header, words0, words1, words2, w, qh = raw
    j = tl.arange(0, 4)[None, None, :, None]
    d, dmin = half_bits(header), half_bits(header >> 16)
    scale_lo, min_lo = _k_scale_min(words0, words1, words2, 2 * j)
    scale_hi, min_hi = _k_scale_min(words0, words1, words2, 2 * j + 1)
    lo, hi = w & LOW4, (w >> 4) & LOW4
    if QTYPE == Q5_K:
        lo = lo | (((qh >> (2 * j)) & ONES) << 4)
        hi = hi | (((qh >> (2 * j + 1)) & ONES) << 4)
    return d * scale_lo, dmin * min_lo, d * scale_hi, dmin * min_hi, lo, hi


@triton.jit
def _q45k_token(scale_lo, min_lo, scale_hi, min_hi, lo, hi, xq_row, xd_row, xs_row, k0, BK: tl.constexpr,
                DP4A: tl.constexpr):
    """One token's ``[BN, G, 4, 1]`` group sums; ``xs``: the activation blocks' ``d * sum(q)``."""
    s = tl.arange(0, BK // 256)[None, :, None, None]
    j = tl.arange(0, 4)[None, None, :, None]
    x_word = xq_row + k0 // 4 + 64 * s + 16 * j + tl.arange(0, 8)[None, None, None, :]       # [1, G, 4, 8]
    block = k0 // 32 + 8 * s + 2 * j                                                          # [1, G, 4, 1]
    x_lo, x_hi = tl.load(x_word), tl.load(x_word + 8)
    is_lo = _dot_sum(lo, x_lo, DP4A).to(tl.float32)
    is_hi = _dot_sum(hi, x_hi, DP4A).to(tl.float32)
    return (tl.load(xd_row + block) * scale_lo * is_lo - tl.load(xs_row + block) * min_lo
            + tl.load(xd_row + block + 1) * scale_hi * is_hi - tl.load(xs_row + block + 1) * min_hi)


# ---- Q6_K: tensors [BN, G, 2, 2, 4] (row, super-block, 128-column half, 16-column run, word)

@triton.jit
def _q6k_raw(w_ptr, row_off, k0, TS: tl.constexpr, BK: tl.constexpr, EVICT: tl.constexpr):
    """The step's packed fields as loaded: ql words of the 4 runs' low nibbles (two sets), qh words
    ``[BN, G, 2, 2, 4]``, d's bits ``[BN, G, 1, 1, 1]`` and the runs' int8 scales ``[BN, G, 2, 2, 1]``."""
    s = tl.arange(0, BK // 256)[None, :, None, None, None]
    n = tl.arange(0, 2)[None, None, :, None, None]
    sub = tl.arange(0, 2)[None, None, None, :, None]
    i = 4 * sub + tl.arange(0, 4)[None, None, None, None, :]
    sb = w_ptr + row_off[:, None, None, None, None] + (k0 // 256 + s) * TS
    scales = (sb + 192 + 8 * n + sub).to(tl.pointer_type(tl.int8))       # run r's scale: scales[2r]
    return (load_u32_from_u16(sb + 64 * n, i, EVICT), load_u32_from_u16(sb + 64 * n, 8 + i, EVICT),
            load_u32_from_u16(sb + 128 + 32 * n, i, EVICT), load_u16(sb + 208, 0, EVICT),
            tl.load(scales, eviction_policy=EVICT), tl.load(scales + 2, eviction_policy=EVICT),
            tl.load(scales + 4, eviction_policy=EVICT), tl.load(scales + 6, eviction_policy=EVICT))


@triton.jit
def _q6k_weights(raw):
    """The 4 column runs of each half: signed-byte words ``[BN, G, 2, 2, 4]`` and ``d * scale``
    ``[BN, G, 2, 2, 1]`` each (layout as in ``triton_dp4a._q6k_step``)."""
    ql_a, ql_b, qh, d_bits, sc0, sc1, sc2, sc3 = raw
    d = half_bits(d_bits)
    v0 = _signed((ql_a & LOW4) | ((qh & LOW2) << 4), 32)
    v1 = _signed((ql_b & LOW4) | (((qh >> 2) & LOW2) << 4), 32)
    v2 = _signed(((ql_a >> 4) & LOW4) | (((qh >> 4) & LOW2) << 4), 32)
    v3 = _signed(((ql_b >> 4) & LOW4) | (((qh >> 6) & LOW2) << 4), 32)
    return (v0, v1, v2, v3, d * sc0.to(tl.float32), d * sc1.to(tl.float32), d * sc2.to(tl.float32),
            d * sc3.to(tl.float32))


@triton.jit
def _q6k_run(v, scale, x_word, xd_ptrs, DP4A: tl.constexpr):
    x = tl.load(x_word)
    isum = _dot_sum(v, x, DP4A).to(tl.float32)
    return tl.load(xd_ptrs) * scale * isum


@triton.jit
def _q6k_token(v0, v1, v2, v3, sc0, sc1, sc2, sc3, xq_row, xd_row, k0, BK: tl.constexpr, DP4A: tl.constexpr):
    """One token's ``[BN, G, 2, 2, 1]`` run sums."""
    s = tl.arange(0, BK // 256)[None, :, None, None, None]
    n = tl.arange(0, 2)[None, None, :, None, None]
    sub = tl.arange(0, 2)[None, None, None, :, None]
    x_word = xq_row + k0 // 4 + 64 * s + 32 * n + 4 * sub + tl.arange(0, 4)[None, None, None, None, :]
    x_block = xd_row + k0 // 32 + 8 * s + 4 * n                                           # [1, G, 2, 1, 1]
    return (_q6k_run(v0, sc0, x_word, x_block, DP4A) + _q6k_run(v1, sc1, x_word + 8, x_block + 1, DP4A)
            + _q6k_run(v2, sc2, x_word + 16, x_block + 2, DP4A) + _q6k_run(v3, sc3, x_word + 24, x_block + 3, DP4A))


# ---- the kernel

@triton.jit
def _raw(w_ptr, row_off, k0, QTYPE: tl.constexpr, TS: tl.constexpr, BK: tl.constexpr, EVICT: tl.constexpr):
    """The step's packed weights as loaded (the type's ``*_raw`` tuple), apart from their unpacking
    (``_weights``): the first step's are loaded before the kernel waits for its activations. ``EVICT``: the
    loads' L1 eviction policy ("" for the default)."""
    if QTYPE == Q4_K or QTYPE == Q5_K:
        return _q45k_raw(w_ptr, row_off, k0, QTYPE, TS, BK, EVICT)
    elif QTYPE == Q6_K:
        return _q6k_raw(w_ptr, row_off, k0, TS, BK, EVICT)
    else:
        return _legacy_raw(w_ptr, row_off, k0, QTYPE, TS, BK, EVICT)


@triton.jit
def _weights(raw, QTYPE: tl.constexpr):
    """The step's unpacked weights as a tuple (the type's ``*_weights``)."""
    if QTYPE == Q4_K or QTYPE == Q5_K:
        return _q45k_weights(raw, QTYPE)
    elif QTYPE == Q6_K:
        return _q6k_weights(raw)
    else:
        return _legacy_weights(raw, QTYPE)


@triton.jit
def _token(w, xq_ptr, xd_ptr, xs_ptr, t: tl.constexpr, T, K, k0, QTYPE: tl.constexpr, BK: tl.constexpr,
           DP4A: tl.constexpr):
    """Token ``t``'s partial sums of this step (a padding token, ``t >= T``, repeats the last one)."""
    row = tl.minimum(T - 1, t).to(tl.int64)
    xq_row, xd_row = xq_ptr + row * (K // 4), xd_ptr + row * (K // 32)
    if QTYPE == Q4_K or QTYPE == Q5_K:
        return _q45k_token(w[0], w[1], w[2], w[3], w[4], w[5], xq_row, xd_row, xs_ptr + row * (K // 32), k0,
                           BK, DP4A)
    elif QTYPE == Q6_K:
        return _q6k_token(w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], xq_row, xd_row, k0, BK, DP4A)
    else:
        return _legacy_token(w[0], w[1], w[2], xq_row, xd_row, k0, QTYPE, BK, DP4A)


@triton.jit
def _zeros(BN: tl.constexpr, QTYPE: tl.constexpr, BK: tl.constexpr):
    """An accumulator in the shape of the type's per-token partial sums."""
    if QTYPE == Q4_K or QTYPE == Q5_K:
        return tl.zeros((BN, BK // 256, 4, 1), dtype=tl.float32)
    elif QTYPE == Q6_K:
        return tl.zeros((BN, BK // 256, 2, 2, 1), dtype=tl.float32)
    else:
        return tl.zeros((BN, BK // 32, 1), dtype=tl.float32)


@triton.jit
def _store(out_ptr, acc, t: tl.constexpr, T, N, pid_k, offs_n, QTYPE: tl.constexpr):
    if QTYPE == Q4_K or QTYPE == Q5_K:
        total = tl.sum(tl.sum(tl.sum(acc, axis=3), axis=2), axis=1)
    elif QTYPE == Q6_K:
        total = tl.sum(tl.sum(tl.sum(tl.sum(acc, axis=4), axis=3), axis=2), axis=1)
    else:
        total = tl.sum(tl.sum(acc, axis=2), axis=1)
    out = out_ptr + (pid_k * T + t).to(tl.int64) * N + offs_n
    tl.store(out, total.to(out_ptr.dtype.element_ty), mask=(offs_n < N) & (t < T))


@triton.jit
def _step(w, accs, xq_ptr, xd_ptr, xs_ptr, T, K, k0, QTYPE: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
          DP4A: tl.constexpr):
    """The 8 token accumulators after one step's unpacked weights ``w`` (tokens past ``BM`` untouched)."""
    acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = accs
    acc0 += _token(w, xq_ptr, xd_ptr, xs_ptr, 0, T, K, k0, QTYPE, BK, DP4A)
    if BM > 1:
        acc1 += _token(w, xq_ptr, xd_ptr, xs_ptr, 1, T, K, k0, QTYPE, BK, DP4A)
    if BM > 2:
        acc2 += _token(w, xq_ptr, xd_ptr, xs_ptr, 2, T, K, k0, QTYPE, BK, DP4A)
        acc3 += _token(w, xq_ptr, xd_ptr, xs_ptr, 3, T, K, k0, QTYPE, BK, DP4A)
    if BM > 4:
        acc4 += _token(w, xq_ptr, xd_ptr, xs_ptr, 4, T, K, k0, QTYPE, BK, DP4A)
        acc5 += _token(w, xq_ptr, xd_ptr, xs_ptr, 5, T, K, k0, QTYPE, BK, DP4A)
        acc6 += _token(w, xq_ptr, xd_ptr, xs_ptr, 6, T, K, k0, QTYPE, BK, DP4A)
        acc7 += _token(w, xq_ptr, xd_ptr, xs_ptr, 7, T, K, k0, QTYPE, BK, DP4A)
    return acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7


@triton.jit
def gemv_tokens_kernel(xq_ptr, xd_ptr, xs_ptr, w_ptr, out_ptr, T, N, K, K_SPLIT, row_bytes,
                       QTYPE: tl.constexpr, TS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr, DP4A: tl.constexpr, EVICT: tl.constexpr = "", PDL: tl.constexpr = False,
                       LATE_WAIT: tl.constexpr = False):
    """``out[pid_k, t, n] = sum over columns pid_k * K_SPLIT .. of W[n] . x_hat[t]`` for every token
    ``t < T <= BM <= 8``, ``BN`` rows per program. ``xq [T, K / 4]`` int32 words, ``xd [T, K / 32]``
    float32 scales, ``xs [T, K / 32]`` their ``d * sum(q)`` (read for Q4_K/Q5_K only). ``EVICT``: the weight
    loads' L1 eviction policy (``gemv_launch.WEIGHT_EVICTION``; "" the default). ``PDL``: the
    first step's weights are loaded before waiting for the kernel that wrote the activations
    (``triton_pdl``); their load overlaps its end. ``LATE_WAIT`` (a sibling launch, ``sibling_launches``: its inputs
    were complete before the kernel before it started): the wait comes only before the stores, so the whole K loop
    may run beside that kernel.

    The first step runs outside the loop for that, so the step's code is there twice: compiling takes
    about twice as long at 1-4 tokens and up to ~10x at 8 (Q6_K: 2.3 -> 24 s on the 2-core dev box,
    once per launch shape, then Triton's cache)."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BN + tl.arange(0, BN)
    row_off = tl.minimum(offs_n, N - 1).to(tl.int64) * row_bytes
    zeros = _zeros(BN, QTYPE, BK)
    k_start = pid_k * K_SPLIT
    raw = _raw(w_ptr, row_off, k_start, QTYPE, TS, BK, EVICT)      # weights: no kernel of the step writes them
    if LATE_WAIT == False:  # noqa: E712 - a constexpr (Triton 3.6 rejects `not` on it here)
        wait_for_previous(PDL, LAUNCH_NEXT=TRITON_GEMV_EARLY_LAUNCH)
    accs = (zeros, zeros, zeros, zeros, zeros, zeros, zeros, zeros)
    accs = _step(_weights(raw, QTYPE), accs, xq_ptr, xd_ptr, xs_ptr, T, K, k_start, QTYPE, BM, BK, DP4A)
    for k_step in range(BK, K_SPLIT, BK):
        k0 = k_start + k_step
        accs = _step(_weights(_raw(w_ptr, row_off, k0, QTYPE, TS, BK, EVICT), QTYPE), accs, xq_ptr, xd_ptr, xs_ptr,
                     T, K, k0, QTYPE, BM, BK, DP4A)
    acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = accs
    if LATE_WAIT:
        wait_for_previous(PDL, LAUNCH_NEXT=TRITON_GEMV_EARLY_LAUNCH)
    _store(out_ptr, acc0, 0, T, N, pid_k, offs_n, QTYPE)
    if BM > 1:
        _store(out_ptr, acc1, 1, T, N, pid_k, offs_n, QTYPE)
    if BM > 2:
        _store(out_ptr, acc2, 2, T, N, pid_k, offs_n, QTYPE)
        _store(out_ptr, acc3, 3, T, N, pid_k, offs_n, QTYPE)
    if BM > 4:
        _store(out_ptr, acc4, 4, T, N, pid_k, offs_n, QTYPE)
        _store(out_ptr, acc5, 5, T, N, pid_k, offs_n, QTYPE)
        _store(out_ptr, acc6, 6, T, N, pid_k, offs_n, QTYPE)
        _store(out_ptr, acc7, 7, T, N, pid_k, offs_n, QTYPE)
