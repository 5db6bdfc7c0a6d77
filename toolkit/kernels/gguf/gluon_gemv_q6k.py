"""One-token GGUF GEMV in Gluon for Q6_K: the layout of ``gluon_gemv`` (each thread sums whole pieces of super-blocks
in registers) for 210-byte super-blocks, which sit only 2-byte aligned in a row.

Why: Q6_K is ffn_down on half an 8B Q4_K_M's layers, its ``attn_v`` and its 128k-row head; the Triton GEMV reads it
at ~57% of a device copy (4096x14336, H100), its 2-byte-aligned fields loaded as 16-bit pairs. Eight super-blocks
are 1,680 bytes, a multiple of 16: in a row whose start is 16-byte aligned (``cols`` a multiple of 2,048), super-block
``k`` of every group of eight starts ``210 k mod 16`` bytes past a 16-byte boundary, a number known when the kernel is
compiled. So a thread walks one group per step with its eight super-blocks unrolled, and reads each 16-byte field
as the two aligned 16-byte vectors around it, the field's four words funnel-shifted out of them by an offset fixed in
the code (``_window``): two vector loads per field instead of eight 16-bit loads.

A thread owns one 64-column piece of each super-block of its group: half ``n`` (128 columns) and run ``sub`` (the
16-column runs 16 sub + 32 s, s = 0..3, of that half): 16 bytes of low nibbles from each of the half's two ql
halves and 16 bytes of qh, the runs' four int8 scales. In ggml's layout (``triton_dp4a._q6k_step``), byte b of ql word
i (i < 8) holds column 4i + b (low nibble) and 64 + 4i + b (high), of ql word 8 + i columns 32 + 4i + b and
96 + 4i + b; qh word i holds their top two bits at shifts 0, 4, 2, 6. Values are ``q - 32``: the kernel dots the
unsigned 6-bit ``q`` and subtracts ``32 sum(x)`` of the run (``sum(x)`` a dp4a of the activation words by ones,
once per thread for all its rows), so the bytes need no sign fix.

The scales and d (bytes 192-209) come the same way (``SCALE_WINDOWS``, ``_window_scales``): the two aligned vectors
around them, which a row's four threads load at the same addresses, so one request serves the four, where four byte
loads and a 16-bit one were five requests per row. The kernel waits on L1 data, not on issue slots (ncu, 4096x14336 on
an H100: 88% of its stalls on the L1TEX scoreboard, 0.23 instructions issued per scheduler and cycle): session 36's
H100 timing of the GEMV alone, us, windows against byte loads: 4096x14336 20.8-21.6 against 21.7-23.4, 14336x4096
20.9-21.9 against 21.9-23.7. Measured and not kept, at 4096x14336 against the windows' 21.5-21.7 in the same run: the
activations' per-16-column sums handed in (16 fewer dp4a per super-block, four more loads or one more vector: 23.1,
22.7) and each field's second vector taken from the neighbouring thread by shuffle instead of loaded (21.9-22.0).

Math as ``triton_gemv_tokens``' Q6_K branch: per 16-column run ``d sc xd dot(q - 32, x)``, float32 sums.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import constexpr_function
from triton.experimental.gluon import language as gl

from ..triton_pdl import GLUON_GEMV_EARLY_LAUNCH
from .gluon_gemv import _floats, dp4a_sum, gemv_layout, lane_word, program_rows, store_rows
from .gluon_pipeline import wait_for_previous
from .triton_words import half_bits

GROUP = gl.constexpr(8)                    # super-blocks per thread and step: 1,680 bytes, a multiple of 16
LOW4 = gl.constexpr(0x0F0F0F0F)
BITS45 = gl.constexpr(0x30303030)
ONES = gl.constexpr(0x01010101)


@constexpr_function
def funnel_ptx(skip):
    """PTX taking 4 words that start ``skip`` bytes (even, < 16) into 8 (two 16-byte vectors): ``$0-$3`` out, the
    vectors' words ``$4-$7`` and ``$8-$11`` in."""
    skip = int(skip)
    word, shift = skip // 4, 8 * (skip % 4)
    return " ".join(f"mov.b32 ${j}, ${4 + word + j};" if shift == 0 else
                    f"shf.r.clamp.b32 ${j}, ${4 + word + j}, ${5 + word + j}, {shift};" for j in range(4))


@gluon.jit
def _window(aligned, word, SKIP: gl.constexpr):
    """The 4 words ``[R, UPR, 4]`` at byte ``aligned [R, UPR]`` (16-byte aligned) + ``SKIP``: one 16-byte load
    where ``SKIP`` is 0, else the two around them and a funnel shift. The loads keep L1's default policy: the
    16 bytes a thread reads past its field are the next field's (its own or a neighbour's), read again from L1.
    Marked to leave L1 first (as the Q4_K kernel's), they were read again from DRAM: 538 against 436 MB for a
    128256x4096 weight of 431 MB (ncu, H100), 240 against 174 us."""
    first = gl.load(aligned.to(gl.pointer_type(gl.uint32))[:, :, None] + word)
    if SKIP == 0:
        return first
    else:
        return funnel(first, gl.load(aligned.to(gl.pointer_type(gl.uint32))[:, :, None] + 4 + word), SKIP)


@gluon.jit
def funnel(first, second, SKIP: gl.constexpr):
    """The 4 words ``[..., 4]`` starting ``SKIP`` bytes (even, 2-14) into the 32 bytes of the 16-byte vectors
    ``first`` and ``second`` (``[..., 4]`` words each, the last axis in one thread): funnel shifts by a constant."""
    return gl.inline_asm_elementwise(funnel_ptx(SKIP), "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [first, second],
                                     dtype=gl.uint32, is_pure=True, pack=4)


@gluon.jit
def _run(q, x, ones):
    """``sum((q - 32) x)`` of a 16-column run, float32 ``[R, UPR]``: ``q [R, UPR, 4]`` unsigned 6-bit bytes,
    ``x [UPR, 4]`` int8 words (``ones`` a tensor like it of 0x01010101)."""
    return (dp4a_sum(q.to(gl.int32, bitcast=True), x[None, :, :])
            - 32 * dp4a_sum(ones[None, :, :], x[None, :, :])).to(gl.float32)


@gluon.jit
def _q6k_fields(group, piece_a, piece_h, word, K: gl.constexpr):
    """Each thread's three 16-byte fields ``[R, UPR, 4]`` (ql of runs 0 and 2, ql of runs 1 and 3, qh) of super-block
    ``K`` of the groups at ``group [R, UPR]`` (bytes, 16-byte aligned); ``piece_a``/``piece_h [1, UPR]`` the
    thread's ql / qh field offsets in a super-block."""
    SKIP: gl.constexpr = (210 * K) % 16
    aligned = group + (210 * K - SKIP)          # one constant offset: the compiler keeps the 16-byte alignment
    return (_window(aligned + piece_a, word, SKIP), _window(aligned + piece_a + 32, word, SKIP),
            _window(aligned + piece_h, word, SKIP))


@gluon.jit
def _window_scales(group, half, sub, word, K: gl.constexpr):
    """The thread's four run scales (float32 ``[R, UPR]`` each) and d of super-block ``K`` of the groups at ``group``,
    from the two aligned 16-byte vectors around bytes 192-209 (the 16 scales, then d). The row's four threads load
    them at the same addresses (one request for the four); the scales are funnel-shifted out as the fields are and the
    thread's four (``8 half + sub + 2j``) picked from two words. ``half``, ``sub [1, UPR]``: the thread's piece."""
    SKIP: gl.constexpr = (210 * K) % 16
    aligned = (group + (210 * K - SKIP + 192)).to(gl.pointer_type(gl.uint32))[:, :, None]
    first, second = gl.load(aligned + word), gl.load(aligned + 4 + word)
    if SKIP == 0:
        packed = first
    else:
        packed = funnel(first, second, SKIP)
    d = half_bits(lane_word(second, word, SKIP // 4) >> (8 * (SKIP % 4)))
    low = gl.sum(gl.where(word == 2 * half[:, :, None], packed, 0), axis=2) >> (8 * sub)       # scales j = 0, 1
    high = gl.sum(gl.where(word == 2 * half[:, :, None] + 1, packed, 0), axis=2) >> (8 * sub)  # j = 2, 3
    return _byte_float(low, 0), _byte_float(low, 16), _byte_float(high, 0), _byte_float(high, 16), d


@gluon.jit
def _byte_float(w, SHIFT: gl.constexpr):
    """float32 of the signed byte at bit ``SHIFT`` of ``w`` (uint32)."""
    return ((w << (24 - SHIFT)).to(gl.int32, bitcast=True) >> 24).to(gl.float32)


@gluon.jit
def _runs(ql_a, ql_b, qh, x, xd):
    """The thread's four runs' integer sums as float32 ``[R, UPR]`` and their activation blocks' scales ``[UPR]``:
    ``x`` the activation word pointers ``[UPR, 4]`` of its first run, ``xd [UPR]`` the pointer to that run's
    32-column block's scale."""
    x0, x1, x2, x3 = gl.load(x), gl.load(x + 8), gl.load(x + 16), gl.load(x + 24)
    xd0, xd1 = _floats(xd)
    xd2, xd3 = _floats(xd + 2)
    ones = gl.full(x0.shape, ONES, gl.int32, x0.type.layout)
    return ((_run((ql_a & LOW4) | ((qh << 4) & BITS45), x0, ones),
             _run((ql_b & LOW4) | ((qh << 2) & BITS45), x1, ones),
             _run(((ql_a >> 4) & LOW4) | (qh & BITS45), x2, ones),
             _run(((ql_b >> 4) & LOW4) | ((qh >> 2) & BITS45), x3, ones)), (xd0, xd1, xd2, xd3))


@gluon.jit
def _q6k_sum(ql_a, ql_b, qh, group, scales, half, sub, word, x, xd, K: gl.constexpr, WINDOWS: gl.constexpr):
    """Each thread's ``[R, UPR]`` sum of its piece of super-block ``K`` of the groups at ``group``, from its fields
    (``_q6k_fields``) and activations (``x``, ``xd`` as ``_runs`` takes them). The scales and d: ``WINDOWS``,
    ``_window_scales`` (``half``, ``sub``, ``word`` as it takes them), after the runs; else, first, four byte loads
    and a 16-bit one at ``scales [1, UPR]`` (the offset of the thread's first scale) and byte 208, each its own
    request per row: the order of session 35's kernel, whose capped launch (64 registers) fits without spilling."""
    if WINDOWS:
        runs, xds = _runs(ql_a, ql_b, qh, x, xd)
        sc0, sc1, sc2, sc3, d = _window_scales(group, half, sub, word, K)
        return d * (sc0 * xds[0][None, :] * runs[0] + sc1 * xds[1][None, :] * runs[1]
                    + sc2 * xds[2][None, :] * runs[2] + sc3 * xds[3][None, :] * runs[3])
    else:  # the scale bytes loaded inside the sum, as session 35's kernel did (its schedule, timed under the cap)
        sb = group + 210 * K
        sc = (sb + scales).to(gl.pointer_type(gl.int8))
        d = half_bits(gl.load((sb + 208).to(gl.pointer_type(gl.uint16))).to(gl.uint32))
        runs, xds = _runs(ql_a, ql_b, qh, x, xd)
        return d * (gl.load(sc).to(gl.float32) * xds[0][None, :] * runs[0]
                    + gl.load(sc + 2).to(gl.float32) * xds[1][None, :] * runs[1]
                    + gl.load(sc + 4).to(gl.float32) * xds[2][None, :] * runs[2]
                    + gl.load(sc + 6).to(gl.float32) * xds[3][None, :] * runs[3])


@gluon.jit
def gluon_gemv_q6k_kernel(xq_ptr, xd_ptr, w_ptr, out_ptr, N, K_SPLIT, row_bytes, GROUPS: gl.constexpr,
                          RPT: gl.constexpr, num_warps: gl.constexpr, PDL: gl.constexpr = False,
                          SCALE_WINDOWS: gl.constexpr = True):
    """``out[pid_k, 0, n] = sum over columns pid_k * K_SPLIT .. of W[n] . x_hat`` for one token; a program has
    ``RPT * 32 / (4 GROUPS) * num_warps`` rows and walks ``GROUPS`` groups of 8 super-blocks per step (``K_SPLIT``
    a multiple of ``2048 GROUPS``). ``xq [K / 4]`` int32 words, ``xd [K / 32]`` float32; ``w`` and ``row_bytes``
    16-byte aligned. ``PDL``: ``triton_pdl``; nothing loads before the wait. ``SCALE_WINDOWS``: ``_q6k_sum``'s
    ``WINDOWS``. Loading the first super-block's fields of each step a step ahead, the first step's before the wait
    (as the Q4_K kernel does), was slower: 8B Q4_K_M at batch 1 392.8 against 397.3 tok/s (engine A/B, H100),
    4096x14336 26.4 against 24.8 us, 128256x4096 193.0 against 173.7."""
    UPR: gl.constexpr = 4 * GROUPS
    ROWS: gl.constexpr = RPT * (32 // UPR) * num_warps
    layout: gl.constexpr = gemv_layout(UPR, RPT, 4, num_warps)  # [rows, pieces, 4 words]
    lay2: gl.constexpr = gl.SliceLayout(2, layout)
    x_lay: gl.constexpr = gl.SliceLayout(0, layout)               # [UPR, 4]: the activations, no row axis
    offs_n, rows = program_rows(w_ptr, N, row_bytes, ROWS, lay2)                            # [R], [R, 1]
    u = gl.arange(0, UPR, layout=gl.SliceLayout(0, lay2))                                   # [UPR]
    half, sub = (u % 4) // 2, u % 2
    piece_a = (64 * half + 16 * sub)[None, :]
    piece_h = (128 + 32 * half + 16 * sub)[None, :]
    scales = (192 + 8 * half + sub)[None, :]
    word = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))[None, None, :]
    ux = gl.arange(0, UPR, layout=gl.SliceLayout(1, x_lay))
    x_words = (512 * (ux // 4) + 32 * ((ux % 4) // 2) + 4 * (ux % 2))[:, None] + \
        gl.arange(0, 4, layout=gl.SliceLayout(0, x_lay))[None, :]                            # [UPR, 4]
    x_blocks = 64 * (u // 4) + 4 * half                                                     # [UPR]
    group0 = gl.program_id(1) * (K_SPLIT // 2048)
    acc = gl.zeros([ROWS, UPR], gl.float32, lay2)
    wait_for_previous(PDL, GLUON_GEMV_EARLY_LAUNCH)
    for step in range(0, K_SPLIT // (2048 * GROUPS)):
        group = group0 + step * GROUPS
        sb0 = rows + (1680 * (group + u // 4))[None, :]                                    # [R, UPR], aligned
        x = xq_ptr + 512 * group + x_words
        xd = xd_ptr + 64 * group + x_blocks
        for k in gl.static_range(GROUP):
            ql_a, ql_b, qh = _q6k_fields(sb0, piece_a, piece_h, word, k)
            acc += _q6k_sum(ql_a, ql_b, qh, sb0, scales, half[None, :], sub[None, :], word, x + 64 * k, xd + 8 * k, k,
                            SCALE_WINDOWS)
    store_rows(out_ptr, acc, offs_n, N)
