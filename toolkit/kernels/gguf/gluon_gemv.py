"""One-token GGUF GEMV in Gluon (Q4_K, Q5_K): each thread owns one 64-column group of a super-block, whole.

Why: the one-token GEMV streams weights, and at 1 token its arithmetic is small, yet ``triton_gemv_tokens`` spends
~270 instructions per warp and step on 1,152 weight bytes (Q4_K, two rows of 1,024 columns: sm_90 SASS of its loop).
Triton lays the step's ``[rows, super-block, group, 8 words]`` tensor out with four words per thread, so every dot
product is summed across two threads (shuffles) and the group's scales and activations are converted between layouts
each step. A pure-load kernel of the same access pattern streams at 84-86% of a device copy on an H100; with ~8
dependent integer operations per loaded word it falls to ~80%, with ~24 to ~60% (``.dev`` stream test, session 20):
the GEMV is short of bandwidth because it is short of issue slots. Here the layout is explicit: a thread holds the 8
quant words of one group (two 16-byte loads), its 16 activation words, and the group's two scales and minimums, so
its two dot products are in-thread dp4a chains; partial sums stay per thread until the end, where one reduction per
row crosses threads.

Math as ``triton_gemv_tokens``' Q4_K/Q5_K branch (activations as int8 blocks of 32 with float32 scales ``xd`` and
``xs = xd * sum(q)``): per 32-column sub-block ``d sc xd dot(q, x) - dmin mn xs``, float32 sums. Q5_K is Q4_K's
super-block with 32 bytes of fifth bits between the scales and the quants (176 bytes, still 16-byte aligned): bit
``2g`` / ``2g + 1`` of byte j is column j's of group g's low / high half, so each of a super-block's four threads loads
those 32 bytes (one request for the four: same addresses) and ORs its two bits into its nibbles.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import constexpr_function
from triton.experimental.gluon import language as gl

from ..triton_pdl import GLUON_GEMV_EARLY_LAUNCH
from .gluon_pipeline import wait_for_previous
from .triton_words import _k_scale_min, half_bits

Q4K_BYTES = gl.constexpr(144)
Q5K_BYTES = gl.constexpr(176)
LOW4 = gl.constexpr(0x0F0F0F0F)
FIFTH = gl.constexpr(0x10101010)


@constexpr_function
def gemv_layout(UPR, RPT, WORDS, num_warps):
    """``[rows, UPR units, WORDS words]``: a thread's ``WORDS`` words of ``RPT`` rows in its registers, ``UPR`` threads
    per row (a row's units in a step: Q4_K groups, Q6_K pieces), the rest of the warp and the other warps on more
    rows."""
    return gl.BlockedLayout([RPT, 1, WORDS], [32 // UPR, UPR, 1], [num_warps, 1, 1], [2, 1, 0])


@gluon.jit
def dp4a_sum(w, x):
    """``sum over the last axis of dp4a(w, x)`` for signed bytes, int32: one chain of dp4a in each thread."""
    return gl.sum(gl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, 0;", "=r,r,r", [w, x], dtype=gl.int32,
                                            is_pure=True, pack=1), axis=len(w.shape) - 1)


@gluon.jit
def lane_word(v, word, W: gl.constexpr):
    """Word ``W`` of each thread's vector ``v [..., 4]`` (``word`` its word indices, ``[1, ..., 1, 4]``): ``v``
    without its last axis. The four words sit in one thread, so the select and sum fold to a register move."""
    return gl.sum(gl.where(word == W, v, 0), axis=len(v.shape) - 1)


@gluon.jit
def program_rows(w_ptr, N, row_bytes, ROWS: gl.constexpr, lay2: gl.constexpr):
    """The one-token GEMVs' rows: this program's row indices ``[ROWS]`` (in ``lay2``'s row slice) and pointers
    ``[ROWS, 1]`` to their packed bytes (rows past N read the last row; ``store_rows`` masks them)."""
    offs_n = gl.program_id(0) * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, lay2))
    return offs_n, (w_ptr + gl.minimum(offs_n, N - 1).to(gl.int64) * row_bytes)[:, None]


@gluon.jit
def store_rows(out_ptr, acc, offs_n, N):
    """Each row's sum of the per-thread partials ``acc [ROWS, UPR]`` into ``out[pid_k, 0, offs_n]`` (rows < N)."""
    total = gl.sum(acc, axis=1)
    gl.store(out_ptr + gl.program_id(1) * N + offs_n, total.to(out_ptr.dtype.element_ty), mask=offs_n < N)


@gluon.jit
def _header16(ptr):
    """The 16 bytes at 16-byte-aligned ``ptr`` as four uint32 (``d | dmin << 16`` and the three scale words): one
    vector load. Triton's own ``gl.load`` of four words would need a layout of four words per thread, and two 8-byte
    loads cost a second request per row for each thread (session 37, H100, GEMV alone: Q4_K 14336x4096 15.0 -> 14.0
    us, Q5_K 4096x14336 18.0 -> 16.5)."""
    return gl.inline_asm_elementwise("ld.global.L1::evict_first.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l",
                                     [ptr.to(gl.int64, bitcast=True)],
                                     dtype=(gl.uint32, gl.uint32, gl.uint32, gl.uint32), is_pure=True, pack=1)


@gluon.jit
def _floats(ptr):
    """Two adjacent float32 at 8-byte-aligned ``ptr`` (one 64-bit load)."""
    both = gl.load(ptr.to(gl.pointer_type(gl.uint64)))
    return ((both & 0xFFFFFFFF).to(gl.uint32).to(gl.float32, bitcast=True),
            (both >> 32).to(gl.uint32).to(gl.float32, bitcast=True))


@gluon.jit
def _k_weights(rows, sb0, head, quants, word, Q5: gl.constexpr):
    """The packed bytes of each thread's group of super-block ``sb0`` + its own offset: ``head``, ``quants [1, UPR]``
    are byte offsets in a row (its super-block, its group), ``word [1, 1, 8]`` word indices. Returns the header word
    ``d | dmin << 16`` and three scale words ``[R, UPR]``, the 8 quant words ``[R, UPR, 8]`` and (``Q5``) the 8 words
    of fifth bits (Q4_K: the quant words again, unused). Weights are read once: loaded to leave L1 first, keeping the
    activations there."""
    row = rows + sb0 * (Q5K_BYTES if Q5 else Q4K_BYTES)                                  # [R, 1]
    dd, sw0, sw1, sw2 = _header16(row + head)
    w = gl.load((row + quants).to(gl.pointer_type(gl.uint32))[:, :, None] + word, eviction_policy="evict_first")
    if Q5:
        high = gl.load((row + head + 16).to(gl.pointer_type(gl.uint32))[:, :, None] + word,
                       eviction_policy="evict_first")
        return dd, sw0, sw1, sw2, w, high
    else:
        return dd, sw0, sw1, sw2, w, w


@gluon.jit
def _fifth_bits(w, high, g, Q5: gl.constexpr):
    """The group's low / high 32 quants as bytes of ``w``'s nibbles, with (``Q5``) bits ``2g`` / ``2g + 1`` of each
    byte of ``high`` as their bit 4 (``high`` shifted by ``g [1, UPR, 1]`` once for both)."""
    lo, hi = w & LOW4, (w >> 4) & LOW4
    if Q5:
        own = high >> (2 * g)
        return lo | ((own << 4) & FIFTH), hi | ((own << 3) & FIFTH)
    else:
        return lo, hi


@gluon.jit
def _k_sums(weights, g, x_lo, x_hi, xd, xs, Q5: gl.constexpr):
    """Each thread's partial sums ``[R, UPR]`` of its group ``g [1, UPR]`` (``weights``: ``_k_weights``') against its
    activations: int8 words ``x_lo``/``x_hi [UPR, 8]`` (of the group's low / high 32 columns, loaded once for the
    thread's rows) and the pointers ``xd``, ``xs [UPR]`` to their blocks' scales and ``xd * sum(q)``."""
    dd, sw0, sw1, sw2, w, high = weights
    q_lo, q_hi = _fifth_bits(w, high, g[:, :, None], Q5)
    lo = dp4a_sum(q_lo.to(gl.int32, bitcast=True), x_lo[None, :, :]).to(gl.float32)
    hi = dp4a_sum(q_hi.to(gl.int32, bitcast=True), x_hi[None, :, :]).to(gl.float32)
    d_lo, d_hi = _floats(xd)
    s_lo, s_hi = _floats(xs)
    d, dmin = half_bits(dd), half_bits(dd >> 16)
    sc_lo, mn_lo = _k_scale_min(sw0, sw1, sw2, 2 * g)
    sc_hi, mn_hi = _k_scale_min(sw0, sw1, sw2, 2 * g + 1)
    return (d * (sc_lo * d_lo[None, :] * lo + sc_hi * d_hi[None, :] * hi)
            - dmin * (mn_lo * s_lo[None, :] + mn_hi * s_hi[None, :]))


@gluon.jit
def gluon_gemv_q4k_kernel(xq_ptr, xd_ptr, xs_ptr, w_ptr, out_ptr, N, K_SPLIT, row_bytes, SB_STEP: gl.constexpr,
                          RPT: gl.constexpr, num_warps: gl.constexpr, PDL: gl.constexpr = False,
                          Q5: gl.constexpr = False):
    """``out[pid_k, 0, n] = sum over columns pid_k * K_SPLIT .. of W[n] . x_hat`` for one token; a program has
    ``RPT * 32 / (4 SB_STEP) * num_warps`` rows and walks ``SB_STEP`` super-blocks per step. ``xq [K / 4]`` int32
    words, ``xd``/``xs [K / 32]`` float32 (``triton_gemv_tokens``' inputs); ``row_bytes`` a 16-byte multiple (16-byte
    loads). ``PDL``: the first step's weights are loaded before waiting for the kernel that wrote the activations
    (``triton_pdl``). ``Q5``: the weight is Q5_K. Each step's weights are loaded in the step (loading the next step's
    ahead, in registers, was slower: 31.5 against 27.8 us at 28672x4096 on an H100)."""
    UPR: gl.constexpr = 4 * SB_STEP
    ROWS: gl.constexpr = RPT * (32 // UPR) * num_warps
    layout: gl.constexpr = gemv_layout(UPR, RPT, 8, num_warps)
    lay2: gl.constexpr = gl.SliceLayout(2, layout)
    x_lay: gl.constexpr = gl.SliceLayout(0, layout)               # [UPR, 8]: the activations, no row axis
    offs_n, rows = program_rows(w_ptr, N, row_bytes, ROWS, lay2)                            # [R], [R, 1]
    u = gl.arange(0, UPR, layout=gl.SliceLayout(0, lay2))                                   # [UPR]
    g = (u % 4)[None, :]
    head = ((u // 4) * (Q5K_BYTES if Q5 else Q4K_BYTES))[None, :]
    word = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))
    quants = head + (48 if Q5 else 16) + 32 * g
    ux = gl.arange(0, UPR, layout=gl.SliceLayout(1, x_lay))
    x_words = (64 * (ux // 4) + 16 * (ux % 4))[:, None] + gl.arange(0, 8, layout=gl.SliceLayout(0, x_lay))[None, :]
    blocks = 8 * (u // 4) + 2 * (u % 4)                                                     # [UPR]
    sb0 = gl.program_id(1) * (K_SPLIT // 256)
    acc = gl.zeros([ROWS, UPR], gl.float32, lay2)
    weights = _k_weights(rows, sb0, head, quants, word[None, None, :], Q5)
    wait_for_previous(PDL, GLUON_GEMV_EARLY_LAUNCH)
    for step in range(1, K_SPLIT // (256 * SB_STEP)):
        x = xq_ptr + 64 * sb0 + x_words
        acc += _k_sums(weights, g, gl.load(x), gl.load(x + 8), xd_ptr + 8 * sb0 + blocks, xs_ptr + 8 * sb0 + blocks,
                       Q5)
        sb0 += SB_STEP
        weights = _k_weights(rows, sb0, head, quants, word[None, None, :], Q5)
    x = xq_ptr + 64 * sb0 + x_words
    acc += _k_sums(weights, g, gl.load(x), gl.load(x + 8), xd_ptr + 8 * sb0 + blocks, xs_ptr + 8 * sb0 + blocks, Q5)
    store_rows(out_ptr, acc, offs_n, N)
