"""One-token GGUF GEMV in Gluon for Q4_0: the layout of ``gluon_gemv`` (each thread sums whole blocks in registers,
four threads per 256 columns) for 18-byte blocks, which sit only 2-byte aligned in a row.

Why: Q4_0 is every weight but the head of a Q4_0 file; ``triton_gemv_tokens`` reads it as 16-bit pairs, and its
layout sums each dot product across threads. Eight blocks are 144 bytes, nine 16-byte vectors, so in a row whose
start is 16-byte aligned (``cols`` a multiple of 256) every group of eight starts on a 16-byte boundary. Thread ``t``
(0-3) of a group owns its blocks ``2t`` and ``2t + 1``, bytes ``36t`` to ``36t + 36``: it loads the three vectors
from byte ``32t`` (the four threads' loads cover the group's 144 bytes and 48 more, read again from L1) and takes its
nine words from word ``t`` on (``window``: two selects per word). Block ``2t``'s scale is the low half of the first of
them and its quants the next 16 bytes, 2 bytes off a word (a funnel shift); block ``2t + 1``'s scale is the high half
of the fifth and its quants the last four words.

The same walk serves Q8_0 (``Q8``): its group of eight 34-byte blocks is 17 vectors, and ``gluon_gemv_q8_0`` holds
what differs (the five vectors a thread loads, its words picked out, the sums of signed bytes).

Measured and not kept (H100): one thread per group of eight blocks (nine vectors a thread, every offset fixed in the
code, no selects) was 1.5x slower than ``triton_gemv_tokens`` at 4096x14336 (24.5 against 16.6 us): each 16-byte
load of the warp touched 32 lines 144 bytes apart, so L1 bounded it.

In ggml's layout quant byte ``j`` of a block holds column ``j`` (low nibble) and ``16 + j`` (high). Values are
``q - 8``: the kernel dots the unsigned nibbles and subtracts ``8 sum(x)`` of the block (``sum(x)`` a dp4a of the
activation words by ones, once per thread for all its rows), so the nibbles need no sign fix.

Math as ``triton_gemv_tokens``' Q4_0 branch: per block ``d xd dot(q - 8, x)``, float32 sums.

The first group's weights are loaded before the PDL wait (``EARLY``), as the Q4_K kernel does: no kernel of a step
writes weights (``triton_pdl``), so their round trip can overlap the end of the kernel before instead of following it
(session 38, H200, GEMV alone with the partial sums handed on, us: 4096x14336 13.8 ->
13.2, 14336x4096 12.3 -> 10.8, 16384x2048 8.3 -> 7.3, 2048x2048 2.2 -> 1.8; the 1.5B Q4_0 file's batch-1 TPOT 0.726
-> 0.668 ms). ptxas: 62 registers against 54 at one row per thread and one warp, 56 either way at two rows and four
warps; nothing spilled.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..triton_pdl import GLUON_GEMV_EARLY_LAUNCH
from .gluon_gemv import _floats, dp4a_sum, gemv_layout, lane_word, program_rows, store_rows
from .gluon_gemv_q6k import funnel
from .gluon_gemv_q8_0 import GROUP_BYTES as Q8_GROUP_BYTES, q8_group_sum, q8_group_words
from .gluon_pipeline import wait_for_previous
from .triton_words import half_bits

GROUP_BYTES = gl.constexpr(144)            # eight blocks of 18 bytes: nine 16-byte vectors
LOW4 = gl.constexpr(0x0F0F0F0F)
ONES = gl.constexpr(0x01010101)
# Words t..t+3 of the 8 in $4-$11 (two vectors), t = $12 (0-3, the same in $13-$15): a shift by one word where t is
# odd, then by two where t >= 2.
WINDOW_PTX = gl.constexpr(
    "{ .reg .pred o, w; .reg .b32 t, r0, r1, r2, r3, r4, r5; and.b32 t, $12, 1; setp.ne.b32 o, t, 0; "
    "and.b32 t, $12, 2; setp.ne.b32 w, t, 0; selp.b32 r0, $5, $4, o; selp.b32 r1, $6, $5, o; "
    "selp.b32 r2, $7, $6, o; selp.b32 r3, $8, $7, o; selp.b32 r4, $9, $8, o; selp.b32 r5, $10, $9, o; "
    "selp.b32 $0, r2, r0, w; selp.b32 $1, r3, r1, w; selp.b32 $2, r4, r2, w; selp.b32 $3, r5, r3, w; }")


@gluon.jit
def window(first, second, t):
    """The 4 words ``[R, UPR, 4]`` from word ``t`` (``[R, UPR, 4]``, 0-3, the thread's) of the 8 in ``first`` and
    ``second`` (each ``[R, UPR, 4]``, the last axis in one thread)."""
    return gl.inline_asm_elementwise(WINDOW_PTX, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r", [first, second, t],
                                     dtype=gl.uint32, is_pure=True, pack=4)


@gluon.jit
def _block(qs, scale, x_lo, x_hi, xd):
    """``d xd dot(q - 8, x)`` of one block, ``[R, UPR]``: ``qs [R, UPR, 4]`` its quant words, ``scale [R, UPR]`` its
    fp16 ``d`` in the low 16 bits, ``x_lo``/``x_hi [UPR, 4]`` the activation words of its columns 0-15 / 16-31,
    ``xd [UPR]`` their scale."""
    ones = gl.full(x_lo.shape, ONES, gl.int32, x_lo.type.layout)
    total = dp4a_sum(ones[None, :, :], x_lo[None, :, :]) + dp4a_sum(ones[None, :, :], x_hi[None, :, :])
    dot = (dp4a_sum((qs & LOW4).to(gl.int32, bitcast=True), x_lo[None, :, :])
           + dp4a_sum(((qs >> 4) & LOW4).to(gl.int32, bitcast=True), x_hi[None, :, :]) - 8 * total)
    return half_bits(scale) * xd[None, :] * dot.to(gl.float32)


@gluon.jit
def _group_words(rows, group, piece, word):
    """The three 16-byte vectors ``[R, UPR, 4]`` from byte ``32 t`` of group ``group`` of each thread's rows."""
    vec = (rows + GROUP_BYTES * group + piece).to(gl.pointer_type(gl.uint32))[:, :, None] + word
    return gl.load(vec), gl.load(vec + 4), gl.load(vec + 8)


@gluon.jit
def _group_sum(vectors, t, word, x, xd):
    """Each thread's ``[R, UPR]`` sum of its two blocks of a group (``vectors``: ``_group_words``', ``t``: the
    thread's word offset) against its activation words ``x [UPR, 4]`` (pointers) and block scales ``xd``."""
    v0, v1, v2 = vectors
    first, second = window(v0, v1, t), window(v1, v2, t)          # words t..t+3, t+4..t+7
    last = window(v2, v2, t)                                      # word t+8 first
    xd_a, xd_b = _floats(xd)
    return (_block(funnel(first, second, 2), lane_word(first, word, 0), gl.load(x), gl.load(x + 4), xd_a)
            + _block(funnel(second, last, 4), lane_word(second, word, 0) >> 16, gl.load(x + 8), gl.load(x + 12), xd_b))


@gluon.jit
def _words(rows, group, piece, word, Q8: gl.constexpr):
    """A group's weight vectors for the thread (``_group_words``, or with ``Q8`` ``q8_group_words``)."""
    if Q8:
        return q8_group_words(rows, group, piece, word)
    else:
        return _group_words(rows, group, piece, word)


@gluon.jit
def _sum(vectors, t, word, x, xd, Q8: gl.constexpr):
    """The thread's sums of a group (``_group_sum``, or with ``Q8`` ``q8_group_sum``)."""
    if Q8:
        return q8_group_sum(vectors, t, word, x, xd)
    else:
        return _group_sum(vectors, t, word, x, xd)


@gluon.jit
def gluon_gemv_q4_0_kernel(xq_ptr, xd_ptr, w_ptr, out_ptr, N, K_SPLIT, row_bytes, GROUPS: gl.constexpr,
                           RPT: gl.constexpr, num_warps: gl.constexpr, PDL: gl.constexpr = False,
                           EARLY: gl.constexpr = True, Q8: gl.constexpr = False):
    """``out[pid_k, 0, n] = sum over columns pid_k * K_SPLIT .. of W[n] . x_hat`` for one token; a program has
    ``RPT * 32 / (4 GROUPS) * num_warps`` rows and walks ``GROUPS`` groups of eight blocks per step (``K_SPLIT`` a
    multiple of ``256 GROUPS``). ``xq [K / 4]`` int32 words, ``xd [K / 32]`` float32; ``w`` and ``row_bytes``
    16-byte aligned. ``PDL``: ``triton_pdl``. ``EARLY`` (the default, module docstring): the first group's weights
    are loaded before the wait (as the Q4_K kernel's first step), each next group's after the group before it is
    summed; else nothing loads before the wait. ``Q8``: the weight is Q8_0 (``gluon_gemv_q8_0``: the same walk over
    groups of eight 34-byte blocks, five vectors a thread)."""
    UPR: gl.constexpr = 4 * GROUPS
    ROWS: gl.constexpr = RPT * (32 // UPR) * num_warps
    GROUP: gl.constexpr = Q8_GROUP_BYTES if Q8 else GROUP_BYTES
    layout: gl.constexpr = gemv_layout(UPR, RPT, 4, num_warps)  # [rows, pieces, 4 words]
    lay2: gl.constexpr = gl.SliceLayout(2, layout)
    x_lay: gl.constexpr = gl.SliceLayout(0, layout)               # [UPR, 4]: the activations, no row axis
    offs_n, rows = program_rows(w_ptr, N, row_bytes, ROWS, lay2)                            # [R], [R, 1]
    u = gl.arange(0, UPR, layout=gl.SliceLayout(0, lay2))                                   # [UPR]
    word = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))[None, None, :]
    piece = (GROUP * (u // 4) + (64 if Q8 else 32) * (u % 4))[None, :]                    # [1, UPR] bytes
    t = gl.zeros([ROWS, UPR, 4], gl.uint32, layout) + ((u % 4).to(gl.uint32))[None, :, None]
    ux = gl.arange(0, UPR, layout=gl.SliceLayout(1, x_lay))
    x_words = (64 * (ux // 4) + 16 * (ux % 4))[:, None] + gl.arange(0, 4, layout=gl.SliceLayout(0, x_lay))[None, :]
    x_blocks = 8 * (u // 4) + 2 * (u % 4)                                                  # [UPR]
    group0 = gl.program_id(1) * (K_SPLIT // 256)
    acc = gl.zeros([ROWS, UPR], gl.float32, lay2)
    if EARLY:
        vectors = _words(rows, group0, piece, word, Q8)
        wait_for_previous(PDL, GLUON_GEMV_EARLY_LAUNCH)
        for step in range(1, K_SPLIT // (256 * GROUPS)):
            group = group0 + (step - 1) * GROUPS
            acc += _sum(vectors, t, word, xq_ptr + 64 * group + x_words, xd_ptr + 8 * group + x_blocks, Q8)
            vectors = _words(rows, group + GROUPS, piece, word, Q8)
        group = group0 + (K_SPLIT // (256 * GROUPS) - 1) * GROUPS
        acc += _sum(vectors, t, word, xq_ptr + 64 * group + x_words, xd_ptr + 8 * group + x_blocks, Q8)
    else:
        wait_for_previous(PDL, GLUON_GEMV_EARLY_LAUNCH)
        for step in range(0, K_SPLIT // (256 * GROUPS)):
            group = group0 + step * GROUPS
            acc += _sum(_words(rows, group, piece, word, Q8), t, word, xq_ptr + 64 * group + x_words,
                        xd_ptr + 8 * group + x_blocks, Q8)
    store_rows(out_ptr, acc, offs_n, N)
