"""GGUF Q6_K matmul for 17 to 64 tokens on Hopper (sm_90) in Gluon: ``gluon_pipeline``'s scheme for Q6_K super-blocks
(256 columns, 210 bytes, only 2-byte aligned: ql[128] low 4 bits, qh[64] high 2 bits, scales[16] int8 (one per 16
columns), d fp16 at byte 208; ``w = d * scale * (q - 32)``). 32-column piece s (0..7) is quarter j = s % 4 of half
h = s // 4 (gguf-py's ``Q6_K.dequantize_blocks``): column c takes nibble j // 2 of ql byte 64 h + 32 (j % 2) + c,
bits 2 j of qh byte 128 + 32 h + c, scale byte 192 + 2 s + (c >= 16).

Per super-block, the next one's bytes are loaded into registers while this one is decoded: six ``[BN, 16]`` byte-pair
tiles (ql bytes 0-31, 32-63, 64-95, 96-127; qh bytes 0-31, 32-63), eight scale words (a piece's two int8 scales) and
d, each reloaded as soon as its last piece is decoded. Decoding: the 6-bit q with the top bit set, four to a 32-bit
register, put into the mantissa of 1.0 by one byte permute per weight (``u = 1 + q / 128``), then one fused
multiply-add ``u * (128 d sc) - 160 d sc = d sc (q - 32)``: both constants are exact in float32, so the value is
gguf-py's float32 one, rounded once to x's dtype. (The int8 scales go through int->float conversions: a permute-built
form measured ~1% slower on an H100.) Registers: BM=64 takes 174 uncapped, two programs per SM where the 64 KB ring
allows three, so the host caps it at 168 (``REGISTER_CAP``; no spills down to 128). H100 (docs/benchmarks.md,
session 19; us, this kernel / ``triton_dot16``): 4096x14336 at 32 tokens 42.5 / 59.8, at 64 56.7 / 82.9; the 8B's
128256x4096 output head 289.8 / 451.7 and 402.0 / 696.1.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .gluon_pipeline import (activation_ring, activation_source, activations_ready, copy_layout,
                             mma_in_flight, operand_layouts, pairs_layout, refill, store_result, wait_for_previous,
                             weight_rows)

Q6K_BYTES = gl.constexpr(210)
REGISTER_CAP = {64: 168}  # by BM: see the module's docstring


def _unit_ptx(j: int) -> str:
    """PTX of quarter ``j``: ql byte pairs ``$4``, qh byte pairs ``$5`` (two uint16 words each, bytes b0 b1 | b2 b3)
    -> float32 ``1 + q / 128`` of the 6-bit q of the even columns (``$0`` <- b0, ``$1`` <- b2) and of the odd ones
    (``$2`` <- b1, ``$3`` <- b3). Shifting a whole word moves bits across bytes only where the masks drop them."""
    low = "mov.b32 t, $4;" if j < 2 else "shr.b32 t, $4, 4;"
    high = ("shl.b32 h, $5, 4;", "shl.b32 h, $5, 2;", "mov.b32 h, $5;", "shr.b32 h, $5, 2;")[j]
    return ("{ .reg .b32 t, h, m; " + low + " " + high + " and.b32 t, t, 0x0F0F0F0F; and.b32 h, h, 0x30303030; "
            "or.b32 t, t, h; or.b32 t, t, 0x80808080; mov.b32 m, 0x3F000000; prmt.b32 $0, t, m, 0x7044; "
            "prmt.b32 $1, t, m, 0x7244; prmt.b32 $2, t, m, 0x7144; prmt.b32 $3, t, m, 0x7344; }")


UNIT_PTX0 = gl.constexpr(_unit_ptx(0))
UNIT_PTX1 = gl.constexpr(_unit_ptx(1))
UNIT_PTX2 = gl.constexpr(_unit_ptx(2))
UNIT_PTX3 = gl.constexpr(_unit_ptx(3))


@gluon.jit
def _load_tile(rows, sb, offset: gl.constexpr, pairs):
    """Bytes ``offset .. offset + 31`` of super-block ``sb`` of each row as ``[BN, 16]`` byte pairs (uint16)."""
    return gl.load((rows + sb * Q6K_BYTES + offset).to(gl.pointer_type(gl.uint16))[:, None] + pairs[None, :])


@gluon.jit
def _load_word(rows, sb, offset: gl.constexpr):
    """The uint16 at byte ``offset`` of super-block ``sb`` of each row, ``[BN]``."""
    return gl.load((rows + sb * Q6K_BYTES + offset).to(gl.pointer_type(gl.uint16)))


@gluon.jit
def _decode(ql, qh, sw, d128, d160, hi, j: gl.constexpr, a_layout: gl.constexpr, dtype: gl.constexpr):
    """Quarter ``j`` of the byte pairs ``ql`` / ``qh`` (``[BN, 16]`` uint16), scale word ``sw`` (``[BN]`` uint16: the
    int8 scales of columns < 16 and >= 16) and ``d128 = 128 d``, ``d160 = 160 d`` (``[BN]`` float32) as the MMA's
    ``[BN, 32]`` first operand in ``dtype``. ``hi``: ``[1, 16]``, pair p >= 8 (columns >= 16; a constant per register,
    so the selects fold away)."""
    s32 = sw.to(gl.int32)
    sc_lo = ((s32 << 24) >> 24).to(gl.float32)
    sc_hi = ((s32 << 16) >> 24).to(gl.float32)
    scale = gl.where(hi, (d128 * sc_hi)[:, None], (d128 * sc_lo)[:, None])            # [BN, 16]; exact products
    bias = gl.where(hi, (d160 * sc_hi)[:, None], (d160 * sc_lo)[:, None])
    if j == 0:
        even, odd = gl.inline_asm_elementwise(UNIT_PTX0, "=r,=r,=r,=r,r,r", [ql, qh], dtype=(gl.float32, gl.float32),
                                              is_pure=True, pack=2)
    elif j == 1:
        even, odd = gl.inline_asm_elementwise(UNIT_PTX1, "=r,=r,=r,=r,r,r", [ql, qh], dtype=(gl.float32, gl.float32),
                                              is_pure=True, pack=2)
    elif j == 2:
        even, odd = gl.inline_asm_elementwise(UNIT_PTX2, "=r,=r,=r,=r,r,r", [ql, qh], dtype=(gl.float32, gl.float32),
                                              is_pure=True, pack=2)
    else:
        even, odd = gl.inline_asm_elementwise(UNIT_PTX3, "=r,=r,=r,=r,r,r", [ql, qh], dtype=(gl.float32, gl.float32),
                                              is_pure=True, pack=2)
    w = gl.join((even * scale - bias).to(dtype), (odd * scale - bias).to(dtype))      # [BN, 16, 2]
    return gl.convert_layout(gl.reshape(w, [w.shape[0], 32]), a_layout, assert_trivial=True)


@gluon.jit
def _superblock(acc, w_prev, d16, a0, a1, a2, a3, h0, h1, s0, s1, s2, s3, s4, s5, s6, s7, rows, pairs, hi, sb, end,
                xs, fill, x_base, x_ok, ahead, WAIT: gl.constexpr, a_layout: gl.constexpr, BM: gl.constexpr):
    """One super-block: its 8 pieces decoded from the registers (loaded one super-block ahead) and fed to
    asynchronous MMAs against the activations in ``xs``, one left in flight; each register tile is reloaded with
    the next super-block's once its last piece is decoded, and once the first MMA has retired the previous
    super-block's last one, super-block ``ahead``'s activations are copied into ``fill``. Returns the carried state."""
    dtype: gl.constexpr = xs.dtype
    nxt = gl.minimum(sb + 1, end - 1)     # the next super-block (the last one re-reads its own)
    d = d16.to(gl.float16, bitcast=True).to(gl.float32)
    d128 = d * 128.0
    d160 = d * 160.0
    d16 = _load_word(rows, nxt, 208)
    activations_ready(WAIT)
    # piece 0: ql tile 0 low, qh tile 0 bits 0-1
    w = _decode(a0, h0, s0, d128, d160, hi, 0, a_layout, dtype)
    s0 = _load_word(rows, nxt, 192)
    acc, w_prev = mma_in_flight(acc, w_prev, w, xs, 0, BM)
    refill(fill, x_base, x_ok, ahead, end, 256)
    w = _decode(a1, h0, s1, d128, d160, hi, 1, a_layout, dtype)
    s1 = _load_word(rows, nxt, 194)
    acc, w_prev = mma_in_flight(acc, w_prev, w, xs, 1, BM)
    w = _decode(a0, h0, s2, d128, d160, hi, 2, a_layout, dtype)
    s2 = _load_word(rows, nxt, 196)
    a0 = _load_tile(rows, nxt, 0, pairs)
    acc, w_prev = mma_in_flight(acc, w_prev, w, xs, 2, BM)
    w = _decode(a1, h0, s3, d128, d160, hi, 3, a_layout, dtype)
    s3 = _load_word(rows, nxt, 198)
    a1 = _load_tile(rows, nxt, 32, pairs)
    h0 = _load_tile(rows, nxt, 128, pairs)
    acc, w_prev = mma_in_flight(acc, w_prev, w, xs, 3, BM)
    # second half: ql tiles 2, 3, qh tile 1
    w = _decode(a2, h1, s4, d128, d160, hi, 0, a_layout, dtype)
    s4 = _load_word(rows, nxt, 200)
    acc, w_prev = mma_in_flight(acc, w_prev, w, xs, 4, BM)
    w = _decode(a3, h1, s5, d128, d160, hi, 1, a_layout, dtype)
    s5 = _load_word(rows, nxt, 202)
    acc, w_prev = mma_in_flight(acc, w_prev, w, xs, 5, BM)
    w = _decode(a2, h1, s6, d128, d160, hi, 2, a_layout, dtype)
    s6 = _load_word(rows, nxt, 204)
    a2 = _load_tile(rows, nxt, 64, pairs)
    acc, w_prev = mma_in_flight(acc, w_prev, w, xs, 6, BM)
    w = _decode(a3, h1, s7, d128, d160, hi, 3, a_layout, dtype)
    s7 = _load_word(rows, nxt, 206)
    a3 = _load_tile(rows, nxt, 96, pairs)
    h1 = _load_tile(rows, nxt, 160, pairs)
    acc, w_prev = mma_in_flight(acc, w_prev, w, xs, 7, BM)
    return acc, w_prev, d16, a0, a1, a2, a3, h0, h1, s0, s1, s2, s3, s4, s5, s6, s7


@gluon.jit
def gluon_q6k_kernel(x_ptr, w_ptr, out_ptr, T, N, K, K_SPLIT, stride_x, row_bytes,
                     BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr,
                     PDL: gl.constexpr = False):
    """Program (row tile, token tile, K split): ``out[pid_k, t, n]`` over its ``K_SPLIT`` columns (whole
    super-blocks); ``row_bytes`` 2-aligned."""
    gl.static_assert(STAGES >= 2, "the activation ring needs at least two super-blocks")
    gl.static_assert(BN % (16 * num_warps) == 0, "BN: a multiple of 16 rows per warp")
    dtype: gl.constexpr = x_ptr.dtype.element_ty
    mma: gl.constexpr = operand_layouts(BN, BM, num_warps)[0]
    a_layout: gl.constexpr = operand_layouts(BN, BM, num_warps)[1]
    ql: gl.constexpr = pairs_layout(gl.to_linear_layout(a_layout, [BN, 32]))
    xl: gl.constexpr = copy_layout(num_warps)

    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    pid_k = gl.program_id(2)
    rows = weight_rows(w_ptr, N, row_bytes, pid_n, BN, ql)
    pairs = gl.arange(0, 16, layout=gl.SliceLayout(0, ql))
    hi = (pairs >= 8)[None, :]                                                   # columns >= 16: second scale
    x_base, x_ok = activation_source(x_ptr, T, stride_x, pid_m, BM, 8, xl)

    nsb = K_SPLIT // 256
    first = pid_k * nsb
    end = first + nsb
    d16 = _load_word(rows, first, 208)
    a0 = _load_tile(rows, first, 0, pairs)
    a1 = _load_tile(rows, first, 32, pairs)
    a2 = _load_tile(rows, first, 64, pairs)
    a3 = _load_tile(rows, first, 96, pairs)
    h0 = _load_tile(rows, first, 128, pairs)
    h1 = _load_tile(rows, first, 160, pairs)
    s0 = _load_word(rows, first, 192)
    s1 = _load_word(rows, first, 194)
    s2 = _load_word(rows, first, 196)
    s3 = _load_word(rows, first, 198)
    s4 = _load_word(rows, first, 200)
    s5 = _load_word(rows, first, 202)
    s6 = _load_word(rows, first, 204)
    s7 = _load_word(rows, first, 206)
    wait_for_previous(PDL)
    acc = gl.zeros([BN, BM], gl.float32, layout=mma)
    w_prev = gl.zeros([BN, 32], dtype, layout=a_layout)                          # the tile of the MMA in flight
    x_smem = activation_ring(dtype, STAGES, 8, BM, x_base, x_ok, first, nsb, 256)
    for i in range(nsb):
        sb = first + i
        acc, w_prev, d16, a0, a1, a2, a3, h0, h1, s0, s1, s2, s3, s4, s5, s6, s7 = _superblock(
            acc, w_prev, d16, a0, a1, a2, a3, h0, h1, s0, s1, s2, s3, s4, s5, s6, s7, rows, pairs, hi, sb, end,
            x_smem.index(i % STAGES), x_smem.index((i + STAGES - 1) % STAGES), x_base, x_ok, sb + STAGES - 1,
            STAGES - 2, a_layout, BM)
    store_result(acc, w_prev, out_ptr, T, N, pid_n, pid_m, pid_k, BN, BM, num_warps)
