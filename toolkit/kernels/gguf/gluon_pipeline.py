"""The pipeline the Gluon GGUF kernels for 17 to 64 tokens share (``gluon_q4_k``, ``gluon_q6_k``, ``gluon_q4_0``;
Hopper, sm_90): layouts, the activations' shared-memory ring, the MMA kept in flight, the result's store.

Why Gluon (Triton's explicit-layout dialect, ``triton.experimental.gluon``): ``triton_dot16`` does the same math in
Triton, whose compiled loop waits for each warpgroup MMA (``wgmma.wait_group 0``) before it decodes the next tile, so
decoding and the tensor cores take turns (docs/benchmarks.md, run 22); Triton has no way to keep an MMA whose first
operand comes from registers in flight. These kernels issue every MMA asynchronously and wait for it one MMA later
(``mma_in_flight``): decoding tile s + 1 runs beside the MMA of tile s.

A program covers ``BN`` weight rows x ``BM`` tokens with one warpgroup (4 warps):
- the decoded ``[BN, 32]`` tile is the MMA's first operand straight from registers (the dot-operand layout of an
  NVMMA v3 layout, ``operand_layouts``), the activations ``[32, BM]`` its second from NVMMA-swizzled shared memory;
- activations go through a ring of ``STAGES`` units (a super-block of 256 columns, or a group of Q4_0 blocks) in
  shared memory, ``[PIECES BM, 32]`` per unit (the ``[BM, 32]`` tile of piece s at rows s BM), each filled by one
  cp.async group ``STAGES - 1`` units ahead (``copy_activations``); a slot is refilled only after the first MMA of the
  next unit has retired the previous unit's last reads and a barrier has seen every warp past that;
- the packed bytes are loaded into registers one unit ahead with plain loads as 16-bit byte pairs (the types' blocks
  are 2- or 4-byte aligned), directly in the first operand's layout (``pairs_layout``): a pair gives two adjacent
  columns of the tile;
- decoding builds ``1 + q / 128`` in the float's mantissa with one byte permute (``LOW_UNIT_PTX`` /
  ``HIGH_UNIT_PTX``, as ``triton_dot16.unit_floats``), then one fused multiply-add to the weight, rounded once to x's
  dtype.
Rows past N are clamped on load and masked on store; tokens past T are zero-filled by the copies. K may be split over
the grid's third axis (whole units), into float32 partial sums the caller reduces. No interpreter runs Gluon:
tests/test_gluon_dot16.py compiles the kernels for sm_90 without a GPU and checks them against gguf-py's
dequantization on one.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import constexpr_function
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

# Low / high nibbles of two uint16 byte pairs packed in $4 (bytes b0 b1 | b2 b3) -> float32 1 + q/128 of the even
# columns ($0 <- b0, $1 <- b2) and of the odd ones ($2 <- b1, $3 <- b3), exactly as ``triton_dot16``'s
# ``nibbles`` + ``unit_floats`` (the nibble with the top bit set becomes bits 16-23 of 0x3F000000).
LOW_UNIT_PTX = gl.constexpr(
    "{ .reg .b32 t, m; and.b32 t, $4, 0x0F0F0F0F; or.b32 t, t, 0x80808080; mov.b32 m, 0x3F000000; "
    "prmt.b32 $0, t, m, 0x7044; prmt.b32 $1, t, m, 0x7244; prmt.b32 $2, t, m, 0x7144; prmt.b32 $3, t, m, 0x7344; }")
HIGH_UNIT_PTX = gl.constexpr(
    "{ .reg .b32 t, m; shr.b32 t, $4, 4; and.b32 t, t, 0x0F0F0F0F; or.b32 t, t, 0x80808080; mov.b32 m, 0x3F000000; "
    "prmt.b32 $0, t, m, 0x7044; prmt.b32 $1, t, m, 0x7244; prmt.b32 $2, t, m, 0x7144; prmt.b32 $3, t, m, 0x7344; }")


@constexpr_function
def copy_layout(num_warps):
    """Blocked layout of a ``[rows, 32]`` activation block for cp.async (any row count): 16 bytes (8 bf16) per thread
    and copy."""
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


@constexpr_function
def operand_layouts(BN, BM, num_warps):
    """(accumulator, first operand) layouts of a ``[BN, 32] x [32, BM]`` warpgroup MMA with the first operand in
    registers."""
    mma = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BM, 16])
    return mma, gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)


@gluon.jit
def wait_for_previous(PDL: gl.constexpr, LAUNCH_NEXT: gl.constexpr = False):
    """``triton_pdl``'s contract: with ``PDL``, wait here for the previous kernel (which wrote the activations); the
    kernels load their first weights before it. The tensor-core kernels never let the next kernel in early (they
    stream weights over the whole GPU); the one-token GEMVs do (``LAUNCH_NEXT``: ``GLUON_GEMV_EARLY_LAUNCH``,
    measured in ``triton_pdl``)."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)
        if LAUNCH_NEXT:
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)


@gluon.jit
def weight_rows(w_ptr, N, row_bytes, pid_n, BN: gl.constexpr, layout: gl.constexpr):
    """``[BN]`` pointers to the program's weight rows (``layout``: the byte-pair tiles'); rows past N read the last
    row (never stored)."""
    offs_n = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
    return w_ptr + gl.minimum(offs_n, N - 1).to(gl.int64) * row_bytes


@gluon.jit
def activation_ring(dtype: gl.constexpr, STAGES: gl.constexpr, PIECES: gl.constexpr, BM: gl.constexpr, x_base, x_ok,
                    first, units, COLS: gl.constexpr):
    """The ring: ``STAGES`` units of ``[PIECES BM, 32]`` activations in NVMMA-swizzled shared memory, its first
    ``STAGES - 1`` (from unit ``first``, of the program's ``units``) already copying (``copy_activations``)."""
    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, 32], dtype)
    x_smem = gl.allocate_shared_memory(dtype, [STAGES, PIECES * BM, 32], x_layout)
    for j in gl.static_range(STAGES - 1):
        copy_activations(x_smem.index(j), x_base, x_ok, first + j, j < units, COLS)
    return x_smem


@gluon.jit
def activation_source(x_ptr, T, stride_x, pid_m, BM: gl.constexpr, PIECES: gl.constexpr, xl: gl.constexpr):
    """``[PIECES BM, 32]`` pointers to unit 0's activations (row s BM + t: piece s, token t) and their mask (tokens
    past T)."""
    xr = gl.arange(0, PIECES * BM, layout=gl.SliceLayout(1, xl))
    tokens = pid_m * BM + xr % BM
    x_base = x_ptr + (tokens.to(gl.int64) * stride_x + 32 * (xr // BM))[:, None] + \
        gl.arange(0, 32, layout=gl.SliceLayout(0, xl))[None, :]
    return x_base, tokens[:, None] < T


@gluon.jit
def copy_activations(dst, x_base, x_ok, unit, more, COLS: gl.constexpr):
    """cp.async of unit ``unit``'s activations (``COLS`` columns) into ``dst`` (nothing read when not ``more``),
    committed as one group."""
    cp.async_copy_global_to_shared(dst, x_base + unit * COLS, mask=x_ok & more)
    cp.commit_group()


@gluon.jit
def activations_ready(WAIT: gl.constexpr):
    """Wait until this unit's activations have landed (``WAIT`` later copy groups may still run) and make the copies'
    writes visible to the MMAs' async proxy (a fence Triton's own pipeliner leaves out)."""
    cp.wait_group(WAIT)
    fence_async_shared()


@gluon.jit
def refill(fill, x_base, x_ok, ahead, end, COLS: gl.constexpr):
    """Copy unit ``ahead``'s activations into ``fill``, the slot the previous unit read; called right after this unit's
    first ``mma_in_flight``, which retired that unit's last MMA: the barrier makes every warp past its own wait before
    any thread overwrites the slot (the compiler takes an MMA's reads as done at its issue, so it would not always put
    a barrier here)."""
    gl.thread_barrier()
    copy_activations(fill, x_base, x_ok, ahead, ahead < end, COLS)


@gluon.jit
def mma_in_flight(acc, w_prev, w, xs, s: gl.constexpr, BM: gl.constexpr):
    """Issue the MMA of tile ``w`` against piece ``s`` of the activations in ``xs`` asynchronously, then retire the
    previous one (its registers ``w_prev``, and at a unit's first piece that unit's last reads of the ring): one MMA
    stays in flight. Returns the accumulator and ``w``, the tile now in flight."""
    acc = warpgroup_mma(w, xs.slice(s * BM, BM).permute((1, 0)), acc, is_async=True)
    acc, w_prev = warpgroup_mma_wait(num_outstanding=1, deps=[acc, w_prev])
    return acc, w


@gluon.jit
def store_result(acc, w_prev, out_ptr, T, N, pid_n, pid_m, pid_k, BN: gl.constexpr, BM: gl.constexpr,
                 num_warps: gl.constexpr):
    """Retire the last MMA and copies, then store ``out[pid_k, t, n]`` (x's dtype, or float32 partial sums when K is
    split), tokens past T and rows past N masked."""
    acc, w_prev = warpgroup_mma_wait(num_outstanding=0, deps=[acc, w_prev])
    cp.wait_group(0)
    ol: gl.constexpr = store_layout(BN, BM, num_warps)
    res = gl.convert_layout(acc.to(out_ptr.dtype.element_ty), ol)
    o_n = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, ol))
    o_t = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, ol))
    out = out_ptr + (pid_k * T + o_t[None, :]).to(gl.int64) * N + o_n[:, None]
    gl.store(out, res, mask=(o_t[None, :] < T) & (o_n[:, None] < N))
