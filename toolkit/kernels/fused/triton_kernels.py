"""Triton kernels for the small per-layer ops of a decoder step: RMSNorm (with the residual add),
rotary embedding of q and k with the angles computed in place, and a gated activation.

Why: as torch expressions these ops are 5-20 kernels each (casts, reductions, cats, cos/sin of
the same angles in every layer). A decode step replays them from a CUDA graph, so launch cost is
small, but each kernel still costs its own few microseconds of GPU time and a round trip
through memory; at batch 1 they summed to ~30% of an 8B Q4_K_M step. One kernel each here.

All arithmetic is float32; results are rounded to the activation dtype once at the end, where
the torch references (kernels/reference.py) round after every operation, so they agree to the
activation dtype's rounding (tests/test_fused_kernels.py).
"""
from __future__ import annotations

import triton
import triton.language as tl

try:  # Triton >= 3.0
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - older Triton
    from triton.language.extra.cuda import libdevice


@triton.jit
def rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, n_cols, stride_x, stride_res, stride_out, stride_sum,
                    eps, offset, HAS_RESIDUAL: tl.constexpr, HAS_OFFSET: tl.constexpr, BLOCK: tl.constexpr):
    """One row per program: ``s = x (+ residual)`` (rounded to x's dtype and stored if a residual
    is given), ``out = s / rms(s) * w`` (``* (offset + w)`` with an offset)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = x + tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        tl.store(sum_ptr + row * stride_sum + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_OFFSET:  # Gemma: (offset + w) in float32, one rounding at the end (as the reference)
        out = xf * inv * (offset + w)
    else:  # Llama: the normalised value is rounded to x's dtype before the weight multiplies it
        out = (xf * inv).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotate(x_ptr, out_ptr, row, stride, stride_out, heads, cos, sin, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
            BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, PASS: tl.constexpr, BLOCK_PASS: tl.constexpr):
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < heads) & (i < HALF)
    base = row * stride + h * HEAD_DIM
    out = row * stride_out + h * HEAD_DIM
    x1 = tl.load(x_ptr + base + i, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base + HALF + i, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    tl.store(out_ptr + out + i, (x1 * cos - x2 * sin).to(dtype), mask=mask)
    tl.store(out_ptr + out + HALF + i, (x2 * cos + x1 * sin).to(dtype), mask=mask)
    if PASS > 0:  # features past rotary_dim are copied unchanged
        p = tl.arange(0, BLOCK_PASS)[None, :]
        pmask = (h < heads) & (p < PASS)
        tl.store(out_ptr + out + 2 * HALF + p, tl.load(x_ptr + base + 2 * HALF + p, mask=pmask), mask=pmask)


@triton.jit
def rotary_qk_kernel(pos_ptr, inv_freq_ptr, q_ptr, k_ptr, q_out_ptr, k_out_ptr, q_heads, k_heads, stride_q, stride_k,
                     stride_qo, stride_ko,
                     HEAD_DIM: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_QH: tl.constexpr,
                     BLOCK_KH: tl.constexpr, PASS: tl.constexpr, BLOCK_PASS: tl.constexpr):
    """One token per program: angles ``position * inv_freq`` (float32, as the reference), then
    rotate-half on every head of q and of k."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)[None, :]
    angle = tl.load(pos_ptr + row).to(tl.float32) * tl.load(inv_freq_ptr + i, mask=i < HALF, other=0.0).to(tl.float32)
    cos, sin = libdevice.cos(angle), libdevice.sin(angle)   # accurate for large angles, unlike sin.approx
    _rotate(q_ptr, q_out_ptr, row, stride_q, stride_qo, q_heads, cos, sin, HEAD_DIM, HALF, BLOCK_QH, BLOCK_HALF, PASS, BLOCK_PASS)
    _rotate(k_ptr, k_out_ptr, row, stride_k, stride_ko, k_heads, cos, sin, HEAD_DIM, HALF, BLOCK_KH, BLOCK_HALF, PASS, BLOCK_PASS)


@triton.jit
def gated_activation_kernel(x_ptr, out_ptr, n_cols, stride_x, stride_out, ACT: tl.constexpr, BLOCK: tl.constexpr):
    """``out[r, c] = act(x[r, c]) * x[r, n_cols + c]``; ACT 0 = silu, 1 = gelu (tanh approximation),
    2 = gelu (erf). Grid: (rows, column blocks)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0)
    if ACT == 0:
        act = gate / (1.0 + tl.exp(-gate))
    elif ACT == 1:
        act = 0.5 * gate * (1.0 + libdevice.tanh(0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)))
    else:
        act = 0.5 * gate * (1.0 + libdevice.erf(gate * 0.7071067811865476))
    # the reference rounds act(gate) to x's dtype before the product
    act = act.to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (act * up.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=mask)
