"""Triton kernels for the small per-layer ops of a decoder step: RMSNorm (with the residual add),
rotary embedding of q and k with the angles computed in place (optionally writing k and v into
the paged KV cache in the same kernel), and a gated activation.

Why: as torch expressions these ops are 5-20 kernels each (casts, reductions, cats, cos/sin of
the same angles in every layer). A decode step replays them from a CUDA graph, so launch cost is
small, but each kernel still costs its own few microseconds of GPU time and a round trip
through memory; at batch 1 they summed to ~30% of an 8B Q4_K_M step. One kernel each here.

All arithmetic is float32; results are rounded to the activation dtype once at the end, where
the torch references (kernels/reference.py) round after every operation, so they agree to the
activation dtype's rounding (tests/test_fused_kernels.py).
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

from ..triton_int8 import store_int8_blocks
from ..triton_pdl import wait_for_previous
from ..triton_reduce import load_summed

try:  # Triton >= 3.0
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - older Triton
    from triton.language.extra.cuda import libdevice

LIBDEVICE = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")  # the interpreter has none (tests on CPUs)


@triton.jit
def rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, n_cols, stride_x, stride_res, stride_out, stride_sum,
                    eps, offset, HAS_RESIDUAL: tl.constexpr, HAS_OFFSET: tl.constexpr, BLOCK: tl.constexpr,
                    q_ptr=None, d_ptr=None, s_ptr=None, QUANT: tl.constexpr = False, SUMS: tl.constexpr = False,
                    SPLITS: tl.constexpr = 1, stride_split=0, PDL: tl.constexpr = False):
    """One row per program: ``s = x (+ residual)`` (rounded to out's dtype and stored if a residual
    is given), ``out = s / rms(s) * w`` (``* (offset + w)`` with an offset). ``SPLITS`` > 1: x is a split-K
    matmul's float32 partial sums, ``stride_split`` apart (``triton_reduce.load_summed``).

    With ``QUANT`` the stored ``out`` is also rounded to int8 blocks of 32 (``triton_int8``): int8
    ``q [rows, n_cols]``, float32 scales and (``SUMS``) block sums ``[rows, n_cols / 32]``, contiguous.
    ``PDL``: the norm weight is read before waiting for the kernel before (``triton_pdl``)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    wait_for_previous(PDL)
    dtype = out_ptr.dtype.element_ty
    x = load_summed(x_ptr + row * stride_x + cols, mask, SPLITS, stride_split, dtype)
    if HAS_RESIDUAL:
        x = x + tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        tl.store(sum_ptr + row * stride_sum + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    if HAS_OFFSET:  # Gemma: (offset + w) in float32, one rounding at the end (as the reference)
        out = xf * inv * (offset + w)
    else:  # Llama: the normalised value is rounded to x's dtype before the weight multiplies it
        out = (xf * inv).to(dtype).to(tl.float32) * w
    out = out.to(dtype)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)
    if QUANT:  # the blocks of what was stored (masked columns are zeros: whole blocks past n_cols stay unwritten)
        blocks = n_cols // 32
        store_int8_blocks(out.to(tl.float32), 0, q_ptr + row * n_cols, d_ptr + row * blocks, s_ptr + row * blocks,
                          blocks, BLOCK // 32, SUMS)


@triton.jit
def _rotate_head(src, dst, cos, sin, w_ptr, eps, offset, dtype: tl.constexpr, SPLITS: tl.constexpr, stride_split,
                 HEAD_DIM: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, PASS: tl.constexpr,
                 BLOCK_PASS: tl.constexpr, NORM: tl.constexpr, HAS_OFFSET: tl.constexpr):
    """Rotate-half of one head ``src[0:2*HALF]`` into ``dst``; features past the rotary part are
    copied. The result is rounded to the activation ``dtype`` (what the reference's output holds), then
    to the destination's (a cache may hold another dtype, as ``store_kv`` casts). ``SPLITS`` > 1: src is
    a split-K matmul's float32 partial sums, ``stride_split`` apart (``triton_reduce.load_summed``).

    With ``NORM`` the head is first RMS-normalised over its ``HEAD_DIM`` features with the weights
    at ``w_ptr`` (Qwen3's and Gemma 3's q/k norms), rounded as ``rms_norm_kernel`` rounds, so the
    rotation reads what the separate norm op would have written."""
    i = tl.arange(0, BLOCK_HALF)
    mask = i < HALF
    x1 = load_summed(src + i, mask, SPLITS, stride_split, dtype).to(tl.float32)
    x2 = load_summed(src + HALF + i, mask, SPLITS, stride_split, dtype).to(tl.float32)
    out_dtype = dst.dtype.element_ty
    p = tl.arange(0, BLOCK_PASS)
    pmask = p < PASS
    if PASS > 0:
        xp = load_summed(src + 2 * HALF + p, pmask, SPLITS, stride_split, dtype).to(tl.float32)
    else:
        xp = tl.zeros((BLOCK_PASS,), dtype=tl.float32)
    if NORM:
        total = tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0) + tl.sum(xp * xp, axis=0)
        inv = 1.0 / tl.sqrt(total / HEAD_DIM + eps)
        x1 = _norm_scale(dtype, x1, inv, tl.load(w_ptr + i, mask=mask, other=0.0), offset, HAS_OFFSET)
        x2 = _norm_scale(dtype, x2, inv, tl.load(w_ptr + HALF + i, mask=mask, other=0.0), offset, HAS_OFFSET)
        xp = _norm_scale(dtype, xp, inv, tl.load(w_ptr + 2 * HALF + p, mask=pmask, other=0.0), offset, HAS_OFFSET)
    tl.store(dst + i, (x1 * cos - x2 * sin).to(dtype).to(out_dtype), mask=mask)
    tl.store(dst + HALF + i, (x2 * cos + x1 * sin).to(dtype).to(out_dtype), mask=mask)
    if PASS > 0:
        tl.store(dst + 2 * HALF + p, xp.to(dtype).to(out_dtype), mask=pmask)


@triton.jit
def _norm_scale(dtype: tl.constexpr, x, inv, w, offset, HAS_OFFSET: tl.constexpr):
    """``rms_norm_kernel``'s output for features ``x`` of a row with ``inv = 1 / rms``, as float32
    holding the value the norm op would store in ``dtype``."""
    if HAS_OFFSET:  # Gemma: (offset + w) in float32, one rounding at the end
        out = x * inv * (offset + w.to(tl.float32))
    else:  # Llama/Qwen: the normalised value is rounded before the weight multiplies it
        out = (x * inv).to(dtype).to(tl.float32) * w.to(tl.float32)
    return out.to(dtype).to(tl.float32)


@triton.jit
def rotary_heads_kernel(pos_ptr, inv_freq_ptr, slot_ptr, q_ptr, k_ptr, v_ptr, q_out_ptr, k_out_ptr, v_out_ptr,
                        q_heads, stride_q, stride_k, stride_v, stride_qo,
                        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                        qw_ptr, kw_ptr, eps, offset,
                        HEAD_DIM: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, PASS: tl.constexpr,
                        BLOCK_PASS: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr,
                        STORE_KV: tl.constexpr, NORM: tl.constexpr = False, HAS_OFFSET: tl.constexpr = False,
                        Q_SPLITS: tl.constexpr = 1, K_SPLITS: tl.constexpr = 1, V_SPLITS: tl.constexpr = 1,
                        split_q=0, split_k=0, split_v=0, PDL: tl.constexpr = False):
    """Program (token t, head h): rotates q head h (h < q_heads) into ``q_out[t]``, or kv head
    ``h - q_heads`` of k into its destination, and with ``STORE_KV`` copies v's head there too.

    k's destination is ``k_out + (s // PAGE) * stride_kb + (s % PAGE) * stride_ks + head * stride_kh``
    with ``s`` the token's cache slot (``slot_ptr[t]``; < 0 is padding and writes nothing) when
    ``STORE_KV``, else ``s = t`` with ``PAGE = 1`` (a plain [T, kv_heads * head_dim] output).
    With ``NORM`` each q head is RMS-normalised with ``qw`` and each k head with ``kw`` first (``eps``,
    and Gemma's weight ``offset`` with ``HAS_OFFSET``); v is never normalised. ``Q_SPLITS``/``K_SPLITS``/
    ``V_SPLITS`` > 1: that input is a split-K matmul's float32 partial sums, ``split_q``/``split_k``/``split_v``
    apart, added as they load (``kernels/split_sums``); the activation dtype is then q_out's.

    Why one head per program: at decode a token's q and k are a few KB, and a single program
    rotating them all (the previous kernel) ran its loads and stores one after another (3.5 us
    on an H100 for one token); one head each, every program does one load round trip and one
    store, in parallel. The angles ``position * inv_freq`` (float32, as the reference) and their
    cos/sin are computed per program, HALF values: cheaper than reading a table of them, which
    would be a second memory round trip after the position's. ``PDL``: the frequencies are read
    before waiting for the kernel before (``triton_pdl``).
    """
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    i = tl.arange(0, BLOCK_HALF)
    freq = tl.load(inv_freq_ptr + i, mask=i < HALF, other=0.0).to(tl.float32)
    wait_for_previous(PDL)
    angle = tl.load(pos_ptr + row).to(tl.float32) * freq
    if LIBDEVICE:
        cos, sin = libdevice.cos(angle), libdevice.sin(angle)   # accurate for large angles, unlike sin.approx
    else:  # Triton's interpreter has no libdevice; its tl.cos/tl.sin are numpy's (accurate too)
        cos, sin = tl.cos(angle), tl.sin(angle)
    dtype = q_out_ptr.dtype.element_ty
    if head < q_heads:
        _rotate_head(q_ptr + row * stride_q + head * HEAD_DIM, q_out_ptr + row * stride_qo + head * HEAD_DIM,
                     cos, sin, qw_ptr, eps, offset, dtype, Q_SPLITS, split_q, HEAD_DIM, HALF, BLOCK_HALF, PASS,
                     BLOCK_PASS, NORM, HAS_OFFSET)
    else:
        kv = head - q_heads
        if STORE_KV:
            slot = tl.load(slot_ptr + row).to(tl.int64)
        else:
            slot = row
        if slot >= 0:
            block, page_offset = slot // PAGE, slot % PAGE
            _rotate_head(k_ptr + row * stride_k + kv * HEAD_DIM,
                         k_out_ptr + block * stride_kb + page_offset * stride_ks + kv * stride_kh,
                         cos, sin, kw_ptr, eps, offset, dtype, K_SPLITS, split_k, HEAD_DIM, HALF, BLOCK_HALF, PASS,
                         BLOCK_PASS, NORM, HAS_OFFSET)
            if STORE_KV:
                d = tl.arange(0, BLOCK_D)
                dmask = d < HEAD_DIM
                value = load_summed(v_ptr + row * stride_v + kv * HEAD_DIM + d, dmask, V_SPLITS, split_v, dtype)
                tl.store(v_out_ptr + block * stride_vb + page_offset * stride_vs + kv * stride_vh + d,
                         value.to(v_out_ptr.dtype.element_ty), mask=dmask)


@triton.jit
def gated_activation_kernel(x_ptr, out_ptr, n_cols, stride_x, stride_out, ACT: tl.constexpr, BLOCK: tl.constexpr,
                            q_ptr=None, d_ptr=None, s_ptr=None, QUANT: tl.constexpr = False,
                            SUMS: tl.constexpr = False, SPLITS: tl.constexpr = 1, stride_split=0,
                            PDL: tl.constexpr = False):
    """``out[r, c] = act(x[r, c]) * x[r, n_cols + c]``; ACT 0 = silu, 1 = gelu (tanh approximation),
    2 = gelu (erf). Grid: (rows, column blocks). ``QUANT``/``SUMS``: the output's int8 blocks as in
    ``rms_norm_kernel`` (``BLOCK`` a multiple of 32). ``SPLITS`` > 1: x is a split-K matmul's float32 partial
    sums, ``stride_split`` apart (``triton_reduce.load_summed``). ``PDL``: ``triton_pdl``."""
    wait_for_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    gate = load_summed(x_ptr + row * stride_x + cols, mask, SPLITS, stride_split, dtype).to(tl.float32)
    up = load_summed(x_ptr + row * stride_x + n_cols + cols, mask, SPLITS, stride_split, dtype)
    if ACT == 0:
        act = gate / (1.0 + tl.exp(-gate))
    elif ACT == 1:
        act = 0.5 * gate * (1.0 + libdevice.tanh(0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)))
    else:
        act = 0.5 * gate * (1.0 + libdevice.erf(gate * 0.7071067811865476))
    # the reference rounds act(gate) to x's dtype before the product
    act = act.to(dtype).to(tl.float32)
    out = (act * up.to(tl.float32)).to(dtype)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)
    if QUANT:
        blocks = n_cols // 32
        store_int8_blocks(tl.where(mask, out.to(tl.float32), 0.0), tl.program_id(1) * (BLOCK // 32),
                          q_ptr + row * n_cols, d_ptr + row * blocks, s_ptr + row * blocks, blocks, BLOCK // 32, SUMS)
