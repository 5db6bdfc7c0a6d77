"""GGUF Q4_K matmul for 17 to 64 tokens on Hopper (sm_90) in Gluon: ``gluon_pipeline``'s scheme for Q4_K super-blocks
(256 columns, 144 bytes: d, dmin, 12 bytes of 6-bit scales and minimums, 128 bytes of nibbles; sub-block s of 32
columns is nibble s % 2 of bytes 16 + 32 (s // 2) ..). Same math as ``triton_dot16``'s Q4_K branch: the weight
``(1 + q / 128) * 128 d sc - (128 d sc + dmin mn)``, one fused multiply-add in float32, rounded once to x's dtype.

Per super-block the 16-byte header and the four 32-byte quant ranges (as ``[BN, 16]`` byte pairs: low nibbles feed
sub-block 2p, high nibbles 2p + 1) of the next super-block are loaded into registers while this one is decoded, each
range as soon as its two sub-blocks are. H100 (docs/benchmarks.md, session 19; us, this kernel / ``triton_dot16``):
28672x4096 at 32 tokens 66.5 / 72.7, 4096x14336 37.1 / 41.1.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .gluon_pipeline import (HIGH_UNIT_PTX, LOW_UNIT_PTX, activation_ring, activation_source, activations_ready,
                             copy_layout, mma_in_flight, operand_layouts, pairs_layout, refill,
                             store_result, wait_for_previous, weight_rows)
# Triton functions a Gluon kernel may call (no layout of their own): the Triton kernels' scale and fp16 decoding
from .triton_mmq import _k_scale_min_words
from .triton_words import half_bits

Q4K_BYTES = gl.constexpr(144)


@gluon.jit
def _load_header(rows, sb):
    """A super-block's d | dmin << 16 and three scale words, ``[BN]`` uint32 each."""
    words = (rows + sb * Q4K_BYTES).to(gl.pointer_type(gl.uint32))
    return gl.load(words), gl.load(words + 1), gl.load(words + 2), gl.load(words + 3)


@gluon.jit
def _load_pairs(rows, sb, p: gl.constexpr, pairs):
    """Quant bytes 32 p .. 32 p + 31 of a super-block as ``[BN, 16]`` byte pairs (uint16): low nibbles sub-block
    2 p, high nibbles sub-block 2 p + 1."""
    return gl.load((rows + sb * Q4K_BYTES + 16 + 32 * p).to(gl.pointer_type(gl.uint16))[:, None] + pairs[None, :])


@gluon.jit
def _decode(q, s: gl.constexpr, d128, dmin, sw0, sw1, sw2, a_layout: gl.constexpr, dtype: gl.constexpr):
    """Sub-block ``s`` (nibble ``s % 2`` of the byte pairs ``q``) as the MMA's ``[BN, 32]`` first operand in
    ``dtype``."""
    sc, mn = _k_scale_min_words(sw0, sw1, sw2, s)
    scale = (d128 * sc)[:, None]
    bias = scale + (dmin * mn)[:, None]
    if s % 2 == 0:
        even, odd = gl.inline_asm_elementwise(LOW_UNIT_PTX, "=r,=r,=r,=r,r", [q], dtype=(gl.float32, gl.float32),
                                              is_pure=True, pack=2)
    else:
        even, odd = gl.inline_asm_elementwise(HIGH_UNIT_PTX, "=r,=r,=r,=r,r", [q], dtype=(gl.float32, gl.float32),
                                              is_pure=True, pack=2)
    w = gl.join((even * scale - bias).to(dtype), (odd * scale - bias).to(dtype))      # [BN, 16, 2]
    return gl.convert_layout(gl.reshape(w, [w.shape[0], 32]), a_layout, assert_trivial=True)


@gluon.jit
def _superblock(acc, w_prev, dd, sw0, sw1, sw2, q0, q1, q2, q3, rows, pairs, sb, end, xs, fill, x_base, x_ok, ahead,
                WAIT: gl.constexpr, a_layout: gl.constexpr, BM: gl.constexpr):
    """One super-block's 8 sub-blocks, decoded from the registers (``dd .. q3``) and fed to MMAs kept in flight
    against ``xs``; the next super-block's bytes are loaded meanwhile and, after the first MMA, super-block
    ``ahead``'s activations are copied into ``fill``. Returns the state carried to the next super-block."""
    dtype: gl.constexpr = xs.dtype
    nxt = gl.minimum(sb + 1, end - 1)     # the next super-block (the last one re-reads its own)
    n_dd, n_sw0, n_sw1, n_sw2 = _load_header(rows, nxt)
    d128 = half_bits(dd) * 128.0
    dmin = half_bits(dd >> 16)
    activations_ready(WAIT)
    for s in gl.static_range(8):
        if s // 2 == 0:
            q = q0
        elif s // 2 == 1:
            q = q1
        elif s // 2 == 2:
            q = q2
        else:
            q = q3
        w = _decode(q, s, d128, dmin, sw0, sw1, sw2, a_layout, dtype)
        if s % 2 == 1:  # pair s // 2 done: the next super-block's, into the same registers
            if s // 2 == 0:
                q0 = _load_pairs(rows, nxt, 0, pairs)
            elif s // 2 == 1:
                q1 = _load_pairs(rows, nxt, 1, pairs)
            elif s // 2 == 2:
                q2 = _load_pairs(rows, nxt, 2, pairs)
            else:
                q3 = _load_pairs(rows, nxt, 3, pairs)
        acc, w_prev = mma_in_flight(acc, w_prev, w, xs, s, BM)
        if s == 0:
            refill(fill, x_base, x_ok, ahead, end, 256)
    return acc, w_prev, n_dd, n_sw0, n_sw1, n_sw2, q0, q1, q2, q3


@gluon.jit
def gluon_q4k_kernel(x_ptr, w_ptr, out_ptr, T, N, K, K_SPLIT, stride_x, row_bytes,
                     BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr,
                     PDL: gl.constexpr = False):
    """Program (row tile, token tile, K split): ``out[pid_k, t, n]`` over its ``K_SPLIT`` columns (whole
    super-blocks); ``row_bytes`` 4-aligned (the header is read as 32-bit words)."""
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
    x_base, x_ok = activation_source(x_ptr, T, stride_x, pid_m, BM, 8, xl)

    nsb = K_SPLIT // 256
    first = pid_k * nsb
    end = first + nsb
    dd, sw0, sw1, sw2 = _load_header(rows, first)
    q0 = _load_pairs(rows, first, 0, pairs)
    q1 = _load_pairs(rows, first, 1, pairs)
    q2 = _load_pairs(rows, first, 2, pairs)
    q3 = _load_pairs(rows, first, 3, pairs)
    wait_for_previous(PDL)
    acc = gl.zeros([BN, BM], gl.float32, layout=mma)
    w_prev = gl.zeros([BN, 32], dtype, layout=a_layout)                          # the tile of the MMA in flight
    x_smem = activation_ring(dtype, STAGES, 8, BM, x_base, x_ok, first, nsb, 256)
    for i in range(nsb):
        sb = first + i
        acc, w_prev, dd, sw0, sw1, sw2, q0, q1, q2, q3 = _superblock(
            acc, w_prev, dd, sw0, sw1, sw2, q0, q1, q2, q3, rows, pairs, sb, end, x_smem.index(i % STAGES),
            x_smem.index((i + STAGES - 1) % STAGES), x_base, x_ok, sb + STAGES - 1, STAGES - 2, a_layout, BM)
    store_result(acc, w_prev, out_ptr, T, N, pid_n, pid_m, pid_k, BN, BM, num_warps)
