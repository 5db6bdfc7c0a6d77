"""2-8-token Q4_0 GEMV in Gluon on int8 tensor cores (``mma.sync`` m16n8k32), with the one-token kernel's loads.

Why: at 2-8 tokens the dp4a GEMV (``triton_gemv_tokens``) dots every weight word with every token's activations in
its own instructions, so at 8 tokens it is short of issue slots, not of bandwidth (the 1.5B Q4_0 at batch 8 spent ~1.0
of a 1.3-1.5 ms step in it). One MMA does 16 rows x 8 tokens x 32 columns: a block of 16 rows for every token at once.
Two ways of feeding it were measured and not kept (docs/benchmarks.md, session 26): quant words loaded straight into
the MMA's registers (every load touched eight rows' lines for 16 bytes each: L1-bound), and every token's
activations in every thread (8x the activation traffic). Here:
- the weights are loaded as ``gluon_gemv_q4_0`` loads them (thread ``t`` of four per row and group of eight blocks
  takes blocks ``2t`` and ``2t + 1`` from three 16-byte vectors: ``window``, ``funnel``), two rows per thread;
- ``gl.convert_layout`` moves them to the MMA's A fragment (a ``st.shared`` and an ``ldmatrix`` per 16 bytes, inside
  the warp: programs are one warp, so no CTA barrier): lane ``4g + c`` gets word ``c`` of every block of rows ``2g``
  and ``2g + 1``, which are the MMA's rows ``g`` and ``g + 8``;
- a quant word's low nibbles are columns ``4c .. 4c + 3`` of its block, its high nibbles ``16 + 4c ..``: exactly
  the A fragment's two k-ranges for lane ``c``, so the activations' B fragment is token ``g``'s words ``c`` and
  ``c + 4`` of the block, loaded as they are;
- a nibble becomes the signed byte ``16 (q - 8)`` with one ``lop3`` (and a shift for the low ones; no sign fix
  later); the MMA's accumulator starts at the bits of the float ``1.5 * 2^23``, so its int32 sum (|sum| < 2^22) comes
  out as that float plus the sum, and the bias comes off inside the fused multiply-add by ``xd`` (no int-to-float
  conversion, which issues at a fraction of the rate of an fma);
- each block's four sums per lane are scaled by ``d`` of their row and ``xd`` of their token and accumulated in
  float32 (``BLOCK_PTX``: nibbles, MMA and scaling in one asm block per block); the 16 comes off once at the end;
- each step loads the next group's weights before it works (the first group's before the PDL wait), and the
  activations' scales as 16-byte vectors.
Measured against the dp4a GEMV: ``gluon_tokens_ops.RULES``.

Math as ``triton_gemv_tokens``' Q4_0 branch: per block ``d xd dot(q - 8, x)``, float32 sums. Rows past N read the last
row and are not stored; tokens past T read token T - 1 and are not stored. K may be split over the grid's second
axis (whole groups of eight blocks), into float32 partial sums the caller reduces.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .gluon_gemv import lane_word
from .gluon_gemv_q4_0 import GROUP_BYTES, window
from .gluon_gemv_q6k import funnel
from .gluon_pipeline import wait_for_previous
from .triton_words import half_bits

# One block for a lane: quant words of rows 2g, 2g + 1 ($4, $5), token g's activation words c, c + 4 ($6, $7), the
# rows' d ($8, $9), tokens 2c, 2c + 1's xd ($10, $11) and -1.5 * 2^23 xd ($12, $13), the float sums of row 2g ($14,
# $15: tokens 2c, 2c + 1) and row 2g + 1 ($16, $17), and three constants kept in registers (pairs, as every operand):
# 0xF0F0F0F0 ($18, $19), 0x80808080 ($20, $21), 0x4B400000 ($22, $23) -> the new sums ($0-$3). 0x4B400000 is
# 1.5 * 2^23 as a float: adding an int32 of magnitude below 2^22 to its bits adds the integer to the float exactly,
# so the MMA starts from it and ``(f - 1.5 * 2^23) xd`` is one fused multiply-add with the second scale pair (the
# product 1.5 * 2^23 xd rounds by at most 0.75 xd: against sums of up to 32 * 128 * 127, noise).
# lop3 0x6A: (a & b) ^ c.
BLOCK_PTX = gl.constexpr(
    "{ .reg .b32 a0, a1, a2, a3, c0, c1, c2, c3; .reg .f32 f; "
    "shl.b32 a0, $4, 4; lop3.b32 a0, a0, $18, $20, 0x6A; "
    "shl.b32 a1, $5, 4; lop3.b32 a1, a1, $18, $20, 0x6A; "
    "lop3.b32 a2, $4, $18, $20, 0x6A; lop3.b32 a3, $5, $18, $20, 0x6A; "
    "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {c0, c1, c2, c3}, {a0, a1, a2, a3}, {$6, $7}, "
    "{$22, $23, $22, $23}; "
    "mov.b32 f, c0; fma.rn.f32 f, f, $10, $12; fma.rn.f32 $0, f, $8, $14; "
    "mov.b32 f, c1; fma.rn.f32 f, f, $11, $13; fma.rn.f32 $1, f, $8, $15; "
    "mov.b32 f, c2; fma.rn.f32 f, f, $10, $12; fma.rn.f32 $2, f, $9, $16; "
    "mov.b32 f, c3; fma.rn.f32 f, f, $11, $13; fma.rn.f32 $3, f, $9, $17; }")
MAGIC = gl.constexpr(0x4B400000)
MAGIC_FLOAT = gl.constexpr(12582912.0)   # 1.5 * 2^23


@gluon.jit
def _group_vectors(rows, word, group):
    """The three 16-byte vectors per row and thread of group ``group`` (``rows [TILES, 16, 4]`` the byte address of
    each row's piece, ``word [1, 1, 1, 4]``)."""
    vec = (rows + GROUP_BYTES * group).to(gl.pointer_type(gl.uint32))[:, :, :, None] + word
    return gl.load(vec), gl.load(vec + 4), gl.load(vec + 8)


@gluon.jit
def _block_pairs(v, frag: gl.constexpr):
    """``v [1, 16, 4 (c), 8 (block)]`` -> its even and odd blocks as ``[1, 16, 4 (s), 4 (c)]`` (blocks ``2s`` and
    ``2s + 1``) in ``frag``."""
    v = gl.permute(gl.reshape(v, [1, 16, 4, 4, 2]), [0, 1, 3, 2, 4])
    even, odd = gl.split(v)
    return gl.convert_layout(even, frag), gl.convert_layout(odd, frag)


@gluon.jit
def _block(q, x, d, dx, acc_even, acc_odd):
    """One block of every row pair: ``(acc_even, acc_odd)`` plus its scaled sums. All ``[TILES, 16, 4, 4]`` in the
    fragment layout (or broadcast to it), each thread's two rows ``2g``, ``2g + 1`` adjacent (``pack=2`` takes them as
    a pair): ``q`` the pair's quant words, ``x`` token ``g``'s words ``c`` and ``c + 4``, ``d`` the rows' ``d``, ``dx``
    tokens ``2c`` and ``2c + 1``'s scales, ``acc_even`` row ``2g``'s sums for those tokens, ``acc_odd`` row
    ``2g + 1``'s."""
    x, d, dx = gl.broadcast(x, q)[0], gl.broadcast(d, q)[0], gl.broadcast(dx, q)[0]
    mask = gl.full(q.shape, 0xF0F0F0F0, gl.uint32, q.type.layout)
    sign = gl.full(q.shape, 0x80808080, gl.uint32, q.type.layout)
    magic = gl.full(q.shape, MAGIC, gl.int32, q.type.layout)
    return gl.inline_asm_elementwise(
        BLOCK_PTX, "=f,=f,=f,=f,r,r,r,r,f,f,f,f,f,f,f,f,f,f,r,r,r,r,r,r",
        [q, x, d, dx, dx * -MAGIC_FLOAT, acc_even, acc_odd, mask, sign, magic],
        dtype=(gl.float32, gl.float32), is_pure=True, pack=2)


@gluon.jit
def gluon_tokens_q4_0_kernel(xq_ptr, xd_ptr, w_ptr, out_ptr, T, N, K_SPLIT, row_bytes, x_stride, xd_stride,
                             TILES: gl.constexpr, PDL: gl.constexpr = False):
    """``out[pid_k, t, n] = sum over columns pid_k * K_SPLIT .. of W[n] . x_hat[t]`` for ``T`` (2-8) tokens; a
    program (one warp) has ``16 TILES`` rows and walks one group of eight blocks per step (``K_SPLIT`` a multiple of
    256). ``xq [T, K / 4]`` int32 words (row stride ``x_stride``), ``xd [T, K / 32]`` float32 (``xd_stride``); ``w``
    and ``row_bytes`` 16-byte aligned."""
    # [tile, row, piece, word]: thread 4g + t holds rows 2g, 2g + 1 of every tile, blocks 2t, 2t + 1's vectors
    load: gl.constexpr = gl.BlockedLayout([1, 2, 1, 4], [1, 8, 4, 1], [1, 1, 1, 1], [3, 2, 1, 0])
    # [tile, row, block pair s, word c]: lane 4g + c holds rows 2g, 2g + 1 (adjacent registers), every s, word c
    frag: gl.constexpr = gl.BlockedLayout([1, 2, 4, 1], [1, 8, 1, 4], [1, 1, 1, 1], [3, 1, 2, 0])
    lay3: gl.constexpr = gl.SliceLayout(3, load)
    R: gl.constexpr = 16 * TILES
    tile = gl.arange(0, TILES, layout=gl.SliceLayout(1, gl.SliceLayout(2, lay3)))[:, None, None]
    r16 = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, lay3)))[None, :, None]
    u = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, lay3)))[None, None, :]
    offs_n = gl.program_id(0) * R + 16 * tile + r16                                        # [TILES, 16, 1]
    rows = w_ptr + gl.minimum(offs_n, N - 1).to(gl.int64) * row_bytes + 32 * u             # [TILES, 16, 4]
    word = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, load))))
    word = word[None, None, None, :]
    t_load = gl.zeros([TILES, 16, 4, 4], gl.uint32, load) + u.to(gl.uint32)[:, :, :, None]
    # fragment-side indices (one tile: the activations are the same for every tile)
    f3: gl.constexpr = gl.SliceLayout(0, frag)
    r = gl.arange(0, 16, layout=gl.SliceLayout(1, gl.SliceLayout(2, f3)))[:, None, None]
    s = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, f3)))[None, :, None]
    c = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, f3)))[None, None, :]
    g, i = r // 2, r % 2
    x_ptrs = (xq_ptr + gl.minimum(g, T - 1) * x_stride + 16 * s + 4 * i + c)[None]           # block 2s's words
    # the scales as two 16-byte vectors per row: [1, 16, 4 (c), 8 (block)] with lane 4g + c holding token 2c + i's
    # eight blocks for i = 0, 1 (rows 2g + i), then taken apart into blocks 2s and 2s + 1 (layout-trivial)
    dx_load: gl.constexpr = gl.BlockedLayout([1, 2, 1, 8], [1, 8, 4, 1], [1, 1, 1, 1], [3, 2, 1, 0])
    r_x = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, dx_load))))[None, :, None, None]
    c_x = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, dx_load))))[None, None, :, None]
    b_x = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, dx_load))))[None, None, None, :]
    dx_ptrs = xd_ptr + gl.minimum(2 * c_x + r_x % 2, T - 1) * xd_stride + b_x
    acc_even = gl.zeros([TILES, 16, 4, 4], gl.float32, frag)
    acc_odd = gl.zeros([TILES, 16, 4, 4], gl.float32, frag)
    steps = K_SPLIT // 256
    group0 = gl.program_id(1) * steps
    # the weights do not depend on the previous kernel: the first group's load before the PDL wait, then each
    # step loads the next group's before it works on its own (the last step loads its own again, unused)
    v0, v1, v2 = _group_vectors(rows, word, group0)
    wait_for_previous(PDL)
    for step in range(0, steps):
        group = group0 + step
        n0, n1, n2 = _group_vectors(rows, word, group0 + gl.minimum(step + 1, steps - 1))
        first, second = window(v0, v1, t_load), window(v1, v2, t_load)               # words t..t+3, t+4..t+7
        q_a = gl.convert_layout(funnel(first, second, 2), frag)                      # block 2s, word c
        q_b = gl.convert_layout(funnel(second, window(v2, v2, t_load), 4), frag)     # block 2s + 1
        # both blocks' fp16 d in one word: block 2t's is the low half of word 9t, block 2t + 1's the high of 9t + 4
        d_pair = gl.convert_layout((lane_word(first, word, 0) & 0xFFFF) | (lane_word(second, word, 0) & 0xFFFF0000),
                                   gl.SliceLayout(3, frag))
        d_a = gl.expand_dims(half_bits(d_pair), 3)
        d_b = gl.expand_dims(half_bits(d_pair >> 16), 3)
        xa = gl.load(x_ptrs + 64 * group)
        xb = gl.load(x_ptrs + 64 * group + 8)
        dxa, dxb = _block_pairs(gl.load(dx_ptrs + 8 * group), frag)
        acc_even, acc_odd = _block(q_a, xa, d_a, dxa, acc_even, acc_odd)
        acc_even, acc_odd = _block(q_b, xb, d_b, dxb, acc_even, acc_odd)
        v0, v1, v2 = n0, n1, n2
    # element (tile, 2g + i, s, c) of acc_even holds row 2g's sum for token 2c + i, of acc_odd row 2g + 1's
    sl: gl.constexpr = gl.SliceLayout(2, frag)
    tile2 = gl.arange(0, TILES, layout=gl.SliceLayout(1, gl.SliceLayout(2, sl)))[:, None, None]
    r2 = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, sl)))[None, :, None]
    c2 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, sl)))[None, None, :]
    i2 = r2 % 2
    even_row = gl.program_id(0) * R + 16 * tile2 + r2 - i2
    token = 2 * c2 + i2
    out = out_ptr + (gl.program_id(1) * T + gl.minimum(token, T - 1)) * N + even_row
    kind = out_ptr.dtype.element_ty
    # the sums are of 16 (q - 8) x: a sixteenth of each, once
    gl.store(out, (gl.sum(acc_even, axis=2) * 0.0625).to(kind), mask=(token < T) & (even_row < N))
    gl.store(out + 1, (gl.sum(acc_odd, axis=2) * 0.0625).to(kind), mask=(token < T) & (even_row + 1 < N))
