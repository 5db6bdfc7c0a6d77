"""GGUF Q4_0 matmul for 17 to 64 tokens on Hopper (sm_90) in Gluon: ``gluon_pipeline``'s scheme for Q4_0's 18-byte
blocks of 32 columns (fp16 d, qs[16]; column c is nibble c // 16 of byte c % 16; weight d (q - 8)).

One block is one MMA step of 32 columns; a loop iteration (the ring's unit) takes ``GROUP`` blocks. The next group's
bytes are loaded into registers while this one is decoded, block s's as soon as block s of this group is: d per row
and the 16 quant bytes as 8 byte pairs (blocks are only 2-byte aligned). Byte pair i (bytes 2i, 2i + 1) gives columns
2i, 2i + 1 (low nibbles) and 16 + 2i, 17 + 2i (high nibbles), which the first operand's threads hold as column pairs i
and 8 + i: the ``[BN, 8]`` words layout is ``pairs_layout`` less its column-pair basis 8, and the two nibble halves
joined on that bit give the operand's layout exactly (a register renaming). Decoding: ``1 + q / 128`` from a byte
permute, one fused multiply-add ``u * 128 d - 136 d = (q - 8) d`` (exact in float32), rounded once to x's dtype.
H100 (docs/benchmarks.md, session 19; us, this kernel / ``triton_dot16``, 1.5B Llama shapes): 16384x2048 at 32 tokens
32.0 / 50.9, 2048x8192 21.6 / 30.8; at 64 tokens with three stages 29.6 / 43.5 and 19.8 / 27.7.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import constexpr_function
from triton.experimental.gluon import language as gl

from .gluon_pipeline import (HIGH_UNIT_PTX, LOW_UNIT_PTX, activation_ring, activation_source, activations_ready,
                             copy_layout, mma_in_flight, operand_layouts, pairs_layout, refill,
                             store_result, wait_for_previous, weight_rows)

Q40_BYTES = gl.constexpr(18)


@constexpr_function
def words_layout(pairs):
    """``[BN, 8]`` uint16 words (byte pairs i of a block's qs) in the layout of ``pairs`` (``[BN, 16]``, column pair j
    of the A operand) restricted to j < 8: ``pairs`` less its basis [0, 8], which must be a register basis (every
    thread then holds both pair i and pair 8 + i, the low and high nibbles of one word)."""
    assert [0, 8] in pairs.reg_bases, pairs
    assert all(b[1] != 8 for b in pairs.lane_bases + pairs.warp_bases), pairs
    return gl.DistributedLinearLayout(reg_bases=[b for b in pairs.reg_bases if b != [0, 8]],
                                      lane_bases=pairs.lane_bases, warp_bases=pairs.warp_bases, block_bases=[],
                                      shape=[pairs.shape[0], 8])


@gluon.jit
def _load_block(rows, b, words):
    """Block ``b`` of each row: d's bits (``[BN]`` uint16) and qs as ``[BN, 8]`` byte pairs (uint16)."""
    block = (rows + b * Q40_BYTES).to(gl.pointer_type(gl.uint16))
    return gl.load(block), gl.load(block[:, None] + 1 + words[None, :])


@gluon.jit
def _load_group(rows, grp, words, GROUP: gl.constexpr):
    """Group ``grp``'s ``GROUP`` blocks: tuples of d bits and of byte pairs, one entry per block."""
    d, q = _load_block(rows, grp * GROUP, words)
    ds = (d,)
    qs = (q,)
    for s in gl.static_range(1, GROUP):
        d, q = _load_block(rows, grp * GROUP + s, words)
        ds = ds + (d,)
        qs = qs + (q,)
    return ds, qs


@gluon.jit
def _decode(q, dbits, a_layout: gl.constexpr, dtype: gl.constexpr):
    """One block as the MMA's ``[BN, 32]`` A operand in ``dtype``: ``(1 + q/128) * 128 d - 136 d``, one FMA in
    float32 (exact), rounded once."""
    d = dbits.to(gl.float16, bitcast=True).to(gl.float32)
    scale = (d * 128.0)[:, None]
    bias = (d * 136.0)[:, None]
    e_lo, o_lo = gl.inline_asm_elementwise(LOW_UNIT_PTX, "=r,=r,=r,=r,r", [q], dtype=(gl.float32, gl.float32),
                                           is_pure=True, pack=2)
    e_hi, o_hi = gl.inline_asm_elementwise(HIGH_UNIT_PTX, "=r,=r,=r,=r,r", [q], dtype=(gl.float32, gl.float32),
                                           is_pure=True, pack=2)
    lo = gl.join((e_lo * scale - bias).to(dtype), (o_lo * scale - bias).to(dtype))   # [BN, 8, 2]: cols 2i + e
    hi = gl.join((e_hi * scale - bias).to(dtype), (o_hi * scale - bias).to(dtype))   # cols 16 + 2i + e
    w = gl.permute(gl.join(lo, hi), (0, 3, 1, 2))                                     # [BN, 2, 8, 2]: col 16h + 2i + e
    return gl.convert_layout(gl.reshape(w, [w.shape[0], 32]), a_layout, assert_trivial=True)


@gluon.jit
def _group(acc, w_prev, ds, qs, rows, words, grp, end, xs, fill, x_base, x_ok, ahead,
           WAIT: gl.constexpr, a_layout: gl.constexpr, BM: gl.constexpr, GROUP: gl.constexpr):
    """One group: its blocks decoded from the registers (``ds``, ``qs``, loaded one group ahead) and fed to
    asynchronous MMAs against the activations in ``xs``, one MMA left in flight; block s of the next group is
    loaded into block s's registers once decoded; once the first MMA wait has retired the previous group's last
    MMA, group ``ahead``'s activations are copied into ``fill`` (the slot that group read)."""
    dtype: gl.constexpr = xs.dtype
    nxt = gl.minimum(grp + 1, end - 1)     # the next group (the last one re-reads its own)
    activations_ready(WAIT)
    for s in gl.static_range(GROUP):
        w = _decode(qs[s], ds[s], a_layout, dtype)
        d, q = _load_block(rows, nxt * GROUP + s, words)
        ds = ds[:s] + (d,) + ds[s + 1:]
        qs = qs[:s] + (q,) + qs[s + 1:]
        acc, w_prev = mma_in_flight(acc, w_prev, w, xs, s, BM)
        if s == 0:
            refill(fill, x_base, x_ok, ahead, end, 32 * GROUP)
    return acc, w_prev, ds, qs


@gluon.jit
def gluon_q40_kernel(x_ptr, w_ptr, out_ptr, T, N, K, K_SPLIT, stride_x, row_bytes,
                     BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, GROUP: gl.constexpr,
                     num_warps: gl.constexpr, PDL: gl.constexpr = False):
    """Program (row tile, token tile, K split): ``out[pid_k, t, n]`` over its ``K_SPLIT`` columns (whole groups of
    ``GROUP`` blocks); ``row_bytes`` 2-aligned."""
    gl.static_assert(STAGES >= 2, "the activation ring needs at least two groups")
    gl.static_assert(BN % (16 * num_warps) == 0, "BN: a multiple of 16 rows per warp")
    dtype: gl.constexpr = x_ptr.dtype.element_ty
    mma: gl.constexpr = operand_layouts(BN, BM, num_warps)[0]
    a_layout: gl.constexpr = operand_layouts(BN, BM, num_warps)[1]
    wl: gl.constexpr = words_layout(pairs_layout(gl.to_linear_layout(a_layout, [BN, 32])))
    xl: gl.constexpr = copy_layout(num_warps)

    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    pid_k = gl.program_id(2)
    rows = weight_rows(w_ptr, N, row_bytes, pid_n, BN, wl)
    words = gl.arange(0, 8, layout=gl.SliceLayout(0, wl))
    x_base, x_ok = activation_source(x_ptr, T, stride_x, pid_m, BM, GROUP, xl)

    ngroups = K_SPLIT // (32 * GROUP)
    first = pid_k * ngroups
    end = first + ngroups
    ds, qs = _load_group(rows, first, words, GROUP)
    wait_for_previous(PDL)
    acc = gl.zeros([BN, BM], gl.float32, layout=mma)
    w_prev = gl.zeros([BN, 32], dtype, layout=a_layout)                          # the tile of the MMA in flight
    x_smem = activation_ring(dtype, STAGES, GROUP, BM, x_base, x_ok, first, ngroups, 32 * GROUP)
    for i in range(ngroups):
        grp = first + i
        acc, w_prev, ds, qs = _group(
            acc, w_prev, ds, qs, rows, words, grp, end, x_smem.index(i % STAGES),
            x_smem.index((i + STAGES - 1) % STAGES), x_base, x_ok, grp + STAGES - 1, STAGES - 2, a_layout, BM, GROUP)
    store_result(acc, w_prev, out_ptr, T, N, pid_n, pid_m, pid_k, BN, BM, num_warps)
