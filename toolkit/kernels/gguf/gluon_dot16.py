"""GGUF Q4_K matmul for 17 to 64 tokens on Hopper (sm_90) in Gluon, Triton's explicit-layout dialect: the weights
are decoded while the previous warpgroup MMA runs.

Why: ``triton_dot16`` (the same math, written in Triton) compiles to decode -> MMA -> ``wgmma.wait_group 0`` for each
of a super-block's 8 sub-blocks, so decoding and the tensor cores take turns (docs/benchmarks.md, run 22); Triton
offers no way to keep an MMA whose first operand comes from registers in flight. Here every MMA is issued
asynchronously and waited for one MMA later (``warpgroup_mma_wait(num_outstanding=1)``): decoding sub-block s + 1 runs
beside the MMA of sub-block s, also across super-blocks. Measured on an H100 against ``triton_dot16``
(docs/benchmarks.md, session 19): 28672x4096 at 32 tokens 66.5 against 72.7 us, 4096x14336 37.1 against 41.1.

Per program (``BN`` weight rows x ``BM`` tokens, 4 warps = one warpgroup):
- the decoded ``[BN, 32]`` tile is the MMA's first operand straight from registers (the dot-operand layout of an
  NVMMA v3 layout), the activations ``[32, BM]`` its second from NVMMA-swizzled shared memory;
- activations go through a ring of ``STAGES`` super-blocks in shared memory (``[8 BM, 32]`` per super-block, the
  ``[BM, 32]`` tile of sub-block s at rows s BM), each filled by one cp.async group ``STAGES - 1`` super-blocks
  ahead; a slot is refilled only after the first MMA of the next super-block has retired the previous one's last
  reads and a barrier has seen every warp past that;
- the packed bytes (and the 16-byte header) of the next super-block are loaded into registers one super-block ahead
  with plain loads, directly in the first operand's layout: 16-bit byte pairs, each giving two adjacent columns of
  the tile of sub-block 2p (low nibbles) and 2p + 1 (high nibbles), reloaded as soon as both are decoded;
- decoding: ``1 + q / 128`` built in the float's mantissa (one byte permute, as ``triton_dot16.unit_floats``), one
  fused multiply-add to ``q * scale - offset``, rounded once to x's dtype.
Rows past N are clamped on load and masked on store; tokens past T are zero-filled by the copies. K may be split over
the grid's third axis (whole super-blocks), into float32 partial sums the caller reduces. No interpreter runs Gluon:
tests/test_gluon_dot16.py compiles it for sm_90 without a GPU and checks it against gguf-py's dequantization on one.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import constexpr_function
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

# Triton functions a Gluon kernel may call (they hold no layout of their own): the Triton kernels' scale and fp16 decoding
from .triton_mmq import _k_scale_min_words
from .triton_words import half_bits

Q4K_BYTES = 144

# Low / high nibbles of two uint16 byte pairs packed in $4 (bytes b0 b1 | b2 b3) -> float32 1 + q/128 of the even
# columns ($0 <- b0, $1 <- b2) and of the odd ones ($2 <- b1, $3 <- b3), exactly as the committed kernel's
# ``nibbles`` + ``unit_floats`` (the nibble with the top bit set becomes bits 16-23 of 0x3F000000).
LOW_UNIT_PTX = gl.constexpr(
    "{ .reg .b32 t, m; and.b32 t, $4, 0x0F0F0F0F; or.b32 t, t, 0x80808080; mov.b32 m, 0x3F000000; "
    "prmt.b32 $0, t, m, 0x7044; prmt.b32 $1, t, m, 0x7244; prmt.b32 $2, t, m, 0x7144; prmt.b32 $3, t, m, 0x7344; }")
HIGH_UNIT_PTX = gl.constexpr(
    "{ .reg .b32 t, m; shr.b32 t, $4, 4; and.b32 t, t, 0x0F0F0F0F; or.b32 t, t, 0x80808080; mov.b32 m, 0x3F000000; "
    "prmt.b32 $0, t, m, 0x7044; prmt.b32 $1, t, m, 0x7244; prmt.b32 $2, t, m, 0x7144; prmt.b32 $3, t, m, 0x7344; }")


@constexpr_function
def copy_layout(rows, num_warps):
    """Blocked layout of a ``[rows, 32]`` activation block for cp.async: 16 bytes (8 bf16) per thread and copy."""
    return gl.BlockedLayout([1, 8], [8, 4], [num_warps, 1], [1, 0])


@constexpr_function
def store_layout(BN, BM, num_warps):
    """Blocked ``[BN, BM]`` layout with rows (contiguous in ``out``) fastest: coalesced stores."""
    return gl.BlockedLayout([4, 1], [min(32, BN // 4), 32 // min(32, BN // 4)], [1, num_warps], [0, 1])


@constexpr_function
def pairs_layout(a_linear):
    """The layout of ``[BN, 16]`` uint16 words (byte pairs) such that a word's two bytes are the two adjacent
    columns a thread holds of the A operand's ``[BN, 32]`` dot-operand layout (``a_linear``, its linear form, whose
    first register basis is [0, 1]): joining two ``[BN, 16]`` halves and reshaping gives that layout exactly."""
    assert a_linear.reg_bases[0] == [0, 1], a_linear
    half = lambda bases: [[r, k // 2] for r, k in bases]
    return gl.DistributedLinearLayout(reg_bases=half(a_linear.reg_bases[1:]), lane_bases=half(a_linear.lane_bases),
                                      warp_bases=half(a_linear.warp_bases), block_bases=[],
                                      shape=[a_linear.shape[0], a_linear.shape[1] // 2])


@gluon.jit
def _load_header(rows, sb):
    """A super-block's d | dmin << 16 and three scale words, ``[BN]`` uint32 each."""
    words = (rows + sb * 144).to(gl.pointer_type(gl.uint32))
    return gl.load(words), gl.load(words + 1), gl.load(words + 2), gl.load(words + 3)


@gluon.jit
def _load_pairs(rows, sb, p: gl.constexpr, pairs):
    """Quant bytes 32 p .. 32 p + 31 of a super-block as ``[BN, 16]`` byte pairs (uint16): low nibbles sub-block
    2 p, high nibbles sub-block 2 p + 1."""
    return gl.load((rows + sb * 144 + 16 + 32 * p).to(gl.pointer_type(gl.uint16))[:, None] + pairs[None, :])


@gluon.jit
def _decode(q, s: gl.constexpr, d128, dmin, sw0, sw1, sw2, a_layout: gl.constexpr, dtype: gl.constexpr):
    """Sub-block ``s`` (nibble ``s % 2`` of the byte pairs ``q``) as the wgmma's ``[BN, 32]`` A operand in ``dtype``:
    ``(1 + q/128) * 128 d sc - (128 d sc + dmin mn)``, one FMA in float32, rounded once."""
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
def _copy_x(dst, x_base, x_ok, sb, more):
    """cp.async of super-block ``sb``'s activations into ``dst`` (``[8 BM, 32]``: sub-block s in rows s BM ..;
    nothing read when not ``more``), committed as one group."""
    cp.async_copy_global_to_shared(dst, x_base + sb * 256, mask=x_ok & more)
    cp.commit_group()


@gluon.jit
def _superblock(acc, w_prev, dd, sw0, sw1, sw2, q0, q1, q2, q3, rows, pairs, sb, end, xs, fill, x_base, x_ok, ahead,
                WAIT: gl.constexpr, a_layout: gl.constexpr, BM: gl.constexpr):
    """One super-block: its 8 sub-blocks decoded from the registers (``dd .. q3``, loaded one super-block ahead) and
    fed to asynchronous wgmmas against the activations in ``xs``, one wgmma left in flight; meanwhile the next
    super-block's weights are loaded (each byte-pair tile as soon as its two sub-blocks are decoded) and, once the
    first wgmma has retired the previous super-block's last one, super-block ``ahead``'s activations are copied into
    ``fill`` (the buffer that super-block read). Returns the carried state for the next super-block."""
    dtype: gl.constexpr = xs.dtype
    nxt = gl.minimum(sb + 1, end - 1)     # the next super-block (the last one re-reads its own)
    n_dd, n_sw0, n_sw1, n_sw2 = _load_header(rows, nxt)
    d128 = half_bits(dd) * 128.0
    dmin = half_bits(dd >> 16)
    cp.wait_group(WAIT)                                                          # this super-block's activations
    fence_async_shared()  # the cp.async writes made visible to the wgmmas' async proxy (Triton's pipeliner omits it)
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
        acc = warpgroup_mma(w, xs.slice(s * BM, BM).permute((1, 0)), acc, is_async=True)
        # Retires the previous wgmma (its A registers and, at s = 0, the previous super-block's last reads).
        acc, w_prev = warpgroup_mma_wait(num_outstanding=1, deps=[acc, w_prev])
        w_prev = w
        if s == 0:
            # Every warp has retired its reads of ``fill`` (the wait above): only then may any thread overwrite it.
            # (The compiler's barrier analysis takes a wgmma's reads as done at its issue, so it would not always put
            # this barrier here.)
            gl.thread_barrier()
            _copy_x(fill, x_base, x_ok, ahead, ahead < end)
    return acc, w_prev, n_dd, n_sw0, n_sw1, n_sw2, q0, q1, q2, q3


@gluon.jit
def gluon_q4k_kernel(x_ptr, w_ptr, out_ptr, T, N, K, K_SPLIT, stride_x, row_bytes,
                     BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr,
                     PDL: gl.constexpr = False):
    """Program (row tile, token tile, K split): ``out[pid_k, t, n]`` over its ``K_SPLIT`` columns (whole super-blocks).
    ``out_ptr``: float32 partials when K is split, else x's dtype (``triton_reduce.split_output``). With ``PDL`` the
    first super-block's weights are loaded before the wait for the previous kernel (``triton_pdl``'s contract:
    nothing an earlier kernel writes is read, and nothing is written, before it); the next kernel is not let in early
    (a matmul streams weights over the whole GPU)."""
    gl.static_assert(STAGES >= 2, "the activation ring needs at least two super-blocks")
    gl.static_assert(BN % (16 * num_warps) == 0, "BN: a multiple of 16 rows per warp")
    dtype: gl.constexpr = x_ptr.dtype.element_ty
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BM, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    ql: gl.constexpr = pairs_layout(gl.to_linear_layout(a_layout, [BN, 32]))
    row_layout: gl.constexpr = gl.SliceLayout(1, ql)
    xl: gl.constexpr = copy_layout(8 * BM, num_warps)
    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, 32], dtype)

    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    pid_k = gl.program_id(2)
    offs_n = pid_n * BN + gl.arange(0, BN, layout=row_layout)
    rows = w_ptr + gl.minimum(offs_n, N - 1).to(gl.int64) * row_bytes          # [BN]; tail rows never stored
    pairs = gl.arange(0, 16, layout=gl.SliceLayout(0, ql))

    xr = gl.arange(0, 8 * BM, layout=gl.SliceLayout(1, xl))                    # row s BM + t: sub-block s, token t
    tokens = pid_m * BM + xr % BM
    x_base = x_ptr + (tokens.to(gl.int64) * stride_x + 32 * (xr // BM))[:, None] + \
        gl.arange(0, 32, layout=gl.SliceLayout(0, xl))[None, :]
    x_ok = tokens[:, None] < T

    nsb = K_SPLIT // 256
    first = pid_k * nsb
    end = first + nsb
    dd, sw0, sw1, sw2 = _load_header(rows, first)
    q0 = _load_pairs(rows, first, 0, pairs)
    q1 = _load_pairs(rows, first, 1, pairs)
    q2 = _load_pairs(rows, first, 2, pairs)
    q3 = _load_pairs(rows, first, 3, pairs)
    if PDL:  # the activations are the previous kernel's output
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)
    acc = gl.zeros([BN, BM], gl.float32, layout=mma)
    w_prev = gl.zeros([BN, 32], dtype, layout=a_layout)                          # A of the wgmma in flight
    x_smem = gl.allocate_shared_memory(dtype, [STAGES, 8 * BM, 32], x_layout)
    for j in gl.static_range(STAGES - 1):                                        # the ring's first super-blocks
        _copy_x(x_smem.index(j), x_base, x_ok, first + j, j < nsb)
    for i in range(nsb):
        sb = first + i
        acc, w_prev, dd, sw0, sw1, sw2, q0, q1, q2, q3 = _superblock(
            acc, w_prev, dd, sw0, sw1, sw2, q0, q1, q2, q3, rows, pairs, sb, end, x_smem.index(i % STAGES),
            x_smem.index((i + STAGES - 1) % STAGES), x_base, x_ok, sb + STAGES - 1, STAGES - 2, a_layout, BM)
    acc, w_prev = warpgroup_mma_wait(num_outstanding=0, deps=[acc, w_prev])
    cp.wait_group(0)

    ol: gl.constexpr = store_layout(BN, BM, num_warps)
    res = gl.convert_layout(acc.to(out_ptr.dtype.element_ty), ol)
    o_n = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, ol))
    o_t = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, ol))
    out = out_ptr + (pid_k * T + o_t[None, :]).to(gl.int64) * N + o_n[:, None]
    gl.store(out, res, mask=(o_t[None, :] < T) & (o_n[:, None] < N))
