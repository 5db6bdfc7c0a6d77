"""Triton kernels: causal conv1d decode step and gated delta rule decode step (see __init__)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

L2_EPS = 1e-6


@triton.jit
def _conv_decode_kernel(x_ptr, w_ptr, state_ptr, slots_ptr, fresh_ptr, out_ptr, channels,
                        stride_x, stride_state_slot, stride_out,
                        WIDTH: tl.constexpr, BLOCK_C: tl.constexpr, ACTIVATION: tl.constexpr):
    seq = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = cols < channels
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    keep = 1.0 - tl.load(fresh_ptr + seq).to(tl.float32)
    state = state_ptr + slot * stride_state_slot + cols * (WIDTH - 1)
    x = tl.load(x_ptr + seq * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    acc = x * tl.load(w_ptr + cols * WIDTH + (WIDTH - 1), mask=mask, other=0.0).to(tl.float32)
    for i in tl.static_range(WIDTH - 1):
        prev = tl.load(state + i, mask=mask, other=0.0).to(tl.float32) * keep
        acc += prev * tl.load(w_ptr + cols * WIDTH + i, mask=mask, other=0.0).to(tl.float32)
        if i > 0:  # shift the window left by one
            tl.store(state + i - 1, prev.to(state_ptr.dtype.element_ty), mask=mask)
    tl.store(state + WIDTH - 2, x.to(state_ptr.dtype.element_ty), mask=mask)
    if ACTIVATION:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(out_ptr + seq * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def causal_conv1d_decode(x, weight, bias, state, slots, fresh, activation: bool = True):
    """Same contract as the reference: x [B, C]; state [slots, C, K - 1] updated in place."""
    batch, channels = x.shape
    width = weight.shape[1]
    out = torch.empty_like(x)
    block = 256
    _conv_decode_kernel[(batch, triton.cdiv(channels, block))](
        x, weight.contiguous(), state, slots, fresh.to(torch.int8), out, channels, x.stride(0), state.stride(0),
        out.stride(0), WIDTH=width, BLOCK_C=block, ACTIVATION=activation)
    if bias is not None:  # no model here has one; kept for the contract
        out = out + bias
    return out


causal_conv1d_decode.supports = lambda x, weight, bias, state, *a, **k: (
    bias is None and state.is_contiguous() and weight.shape[1] >= 2 and x.stride(1) == 1)


@triton.jit
def _gdr_decode_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, slots_ptr, fresh_ptr, out_ptr,
                       stride_qb, stride_qh, stride_vb, stride_vh, stride_gb, stride_ob, stride_oh,
                       stride_ss, stride_sh, ratio, scale,
                       DK: tl.constexpr, DV: tl.constexpr, BLOCK_V: tl.constexpr):
    seq, head, vblock = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    khead = head // ratio
    dk = tl.arange(0, DK)
    dv = vblock * BLOCK_V + tl.arange(0, BLOCK_V)
    vmask = dv < DV
    q = tl.load(q_ptr + seq * stride_qb + khead * stride_qh + dk).to(tl.float32)
    k = tl.load(k_ptr + seq * stride_qb + khead * stride_qh + dk).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q) + 1e-6) * scale
    k = k * tl.rsqrt(tl.sum(k * k) + 1e-6)
    v = tl.load(v_ptr + seq * stride_vb + head * stride_vh + dv, mask=vmask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + seq * stride_gb + head).to(tl.float32)
    beta = tl.load(beta_ptr + seq * stride_gb + head).to(tl.float32)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    keep = 1.0 - tl.load(fresh_ptr + seq).to(tl.float32)
    ptrs = state_ptr + slot * stride_ss + head * stride_sh + dk[:, None] * DV + dv[None, :]
    s = tl.load(ptrs, mask=vmask[None, :], other=0.0) * (keep * tl.exp(g))
    predicted = tl.sum(s * k[:, None], axis=0)
    s = s + k[:, None] * ((v - predicted) * beta)[None, :]
    tl.store(ptrs, s, mask=vmask[None, :])
    out = tl.sum(s * q[:, None], axis=0)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + dv, out.to(out_ptr.dtype.element_ty), mask=vmask)


def gated_delta_rule_decode(q, k, v, g, beta, state, slots, fresh):
    """Same contract as the reference: q, k [B, HK, dk]; v [B, HV, dv]; g, beta [B, HV];
    state [slots, HV, dk, dv] float32 updated in place; returns [B, HV, dv] in v's dtype."""
    batch, heads, dv = v.shape
    dk = q.shape[-1]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g, beta = g.float().contiguous(), beta.float().contiguous()
    out = torch.empty_like(v)
    block_v = min(32, triton.next_power_of_2(dv))
    _gdr_decode_kernel[(batch, heads, triton.cdiv(dv, block_v))](
        q, k, v, g, beta, state, slots, fresh.to(torch.int8), out,
        q.stride(0), q.stride(1), v.stride(0), v.stride(1), g.stride(0), out.stride(0), out.stride(1),
        state.stride(0), state.stride(1), heads // q.shape[1], dk ** -0.5, DK=dk, DV=dv, BLOCK_V=block_v)
    return out


gated_delta_rule_decode.supports = lambda q, k, v, g, beta, state, *a, **k_: (
    state.dtype == torch.float32 and state.is_contiguous() and q.shape[-1] == triton.next_power_of_2(q.shape[-1]))

OPS = {"causal_conv1d_decode": causal_conv1d_decode, "gated_delta_rule_decode": gated_delta_rule_decode}
