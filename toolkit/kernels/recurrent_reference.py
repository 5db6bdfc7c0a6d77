"""Pure-torch reference ops for recurrent (linear-attention) layers: the oracle for faster
kernels and what runs on CPU. Registered through ``reference.register_kernels``.

Conventions shared by every op here (the flat varlen batch of the engine):

* tokens of all sequences are concatenated; ``query_start_loc`` [num_seqs + 1] delimits them;
* ``state`` is a pool tensor [num_slots, ...] (or None: start from zero, keep nothing);
  ``slots`` [num_seqs] picks each sequence's row, ``fresh`` [num_seqs] (bool) says the
  sequence starts here, so its previous row content is ignored and treated as zero;
* updated states are written back into ``state[slots]`` in place.

Gated delta rule (Gated DeltaNet), per value head with state S [dk, dv]:
``S_t = exp(g_t) * S_{t-1} + beta_t * k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T``, ``o_t = S_t^T q_t``,
with q and k L2-normalised and q scaled by ``dk ** -0.5``; value head ``h`` reads key head
``h // (HV // HK)`` (grouped order).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

L2_EPS = 1e-6


def _segments(query_start_loc: torch.Tensor) -> list[tuple[int, int]]:
    bounds = query_start_loc.tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def _initial(state: torch.Tensor | None, slot: int, fresh: bool, shape, dtype, device) -> torch.Tensor:
    if state is None or fresh:
        return torch.zeros(shape, dtype=dtype, device=device)
    return state[slot].to(dtype)


# ---- causal depthwise conv1d ------------------------------------------------------------------
def causal_conv1d_prefill(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          state: torch.Tensor | None, query_start_loc: torch.Tensor, slots: torch.Tensor | None,
                          fresh: torch.Tensor | None, activation: bool = True) -> torch.Tensor:
    """Depthwise causal conv over each sequence's tokens, continuing from its conv state.

    x: [T, C]; weight: [C, K]; state: [num_slots, C, K - 1] (the last K - 1 inputs seen).
    Returns [T, C] (SiLU applied when ``activation``), in x's dtype.
    """
    channels, width = weight.shape
    out = torch.empty_like(x)
    for i, (start, end) in enumerate(_segments(query_start_loc)):
        slot = int(slots[i]) if slots is not None else 0
        is_fresh = True if fresh is None else bool(fresh[i])
        prev = _initial(state, slot, is_fresh, (channels, width - 1), weight.dtype, x.device)
        window = torch.cat((prev, x[start:end].t().to(weight.dtype)), dim=1)  # [C, K - 1 + L]
        if end > start:  # an empty sequence only carries (or, fresh, clears) its window
            y = F.conv1d(window.unsqueeze(0), weight.unsqueeze(1), bias, groups=channels)[0]  # [C, L]
            if activation:
                y = F.silu(y)
            out[start:end] = y.t().to(x.dtype)
        if state is not None:
            state[slot] = window[:, window.shape[1] - (width - 1):].to(state.dtype)
    return out


def causal_conv1d_decode(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, state: torch.Tensor,
                         slots: torch.Tensor, fresh: torch.Tensor, activation: bool = True) -> torch.Tensor:
    """One new token per sequence. x: [B, C]; state rows [C, K - 1] are shifted by one in place."""
    prev = state[slots].to(weight.dtype) * (~fresh).to(weight.dtype)[:, None, None]  # [B, C, K - 1]
    window = torch.cat((prev, x.to(weight.dtype).unsqueeze(-1)), dim=-1)              # [B, C, K]
    y = (window * weight.unsqueeze(0)).sum(-1)
    if bias is not None:
        y = y + bias
    if activation:
        y = F.silu(y)
    state[slots] = window[..., 1:].to(state.dtype)
    return y.to(x.dtype)


# ---- gated delta rule -------------------------------------------------------------------------
def _prepare(q, k, v, g, beta):
    """fp32, keys repeated onto value heads (grouped), q/k L2-normalised, q scaled."""
    groups = v.shape[-2] // k.shape[-2]
    q, k = _l2norm(q.float()), _l2norm(k.float())
    if groups > 1:
        q, k = q.repeat_interleave(groups, dim=-2), k.repeat_interleave(groups, dim=-2)
    return q * q.shape[-1] ** -0.5, k, v.float(), g.float(), beta.float()


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def gated_delta_rule_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                            state: torch.Tensor, slots: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor:
    """One recurrent step per sequence. q, k: [B, HK, dk]; v: [B, HV, dv]; g, beta: [B, HV];
    state: [num_slots, HV, dk, dv] (float32), updated in place. Returns [B, HV, dv] in v's dtype."""
    q, k, vf, g, beta = _prepare(q, k, v, g, beta)
    s = state[slots].float() * (~fresh).float()[:, None, None, None]
    s = s * g.exp()[..., None, None]
    predicted = torch.einsum("bhkv,bhk->bhv", s, k)
    s = s + torch.einsum("bhk,bhv->bhkv", k, (vf - predicted) * beta[..., None])
    state[slots] = s.to(state.dtype)
    return torch.einsum("bhkv,bhk->bhv", s, q).to(v.dtype)


def gated_delta_rule_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                             state: torch.Tensor | None, query_start_loc: torch.Tensor, slots: torch.Tensor | None,
                             fresh: torch.Tensor | None, chunk_size: int = 64) -> torch.Tensor:
    """Chunked gated delta rule over each sequence, resuming from its state.

    q, k: [T, HK, dk]; v: [T, HV, dv]; g, beta: [T, HV]. Returns [T, HV, dv] in v's dtype.
    """
    out = torch.empty_like(v)
    qf, kf, vf, gf, bf = _prepare(q, k, v, g, beta)
    heads, dk, dv = vf.shape[1], kf.shape[-1], vf.shape[-1]
    for i, (start, end) in enumerate(_segments(query_start_loc)):
        slot = int(slots[i]) if slots is not None else 0
        is_fresh = True if fresh is None else bool(fresh[i])
        s = _initial(state, slot, is_fresh, (heads, dk, dv), torch.float32, v.device)
        for c0 in range(start, end, chunk_size):
            c1 = min(c0 + chunk_size, end)
            o, s = _chunk(qf[c0:c1], kf[c0:c1], vf[c0:c1], gf[c0:c1], bf[c0:c1], s)
            out[c0:c1] = o.to(v.dtype)
        if state is not None:
            state[slot] = s.to(state.dtype)
    return out


def _chunk(q, k, v, g, beta, s):
    """One chunk of L tokens (all heads) from state s [H, dk, dv]; returns (out [L, H, dv], new s).

    Within the chunk, with G_t = sum_{i<=t} g_i, the corrected values u solve the unit lower
    triangular system (I + A) u = beta * (v - exp(G) k^T s) with A_ts = beta_t exp(G_t - G_s) k_t.k_s
    for s < t; outputs are o_t = exp(G_t) q_t^T s + sum_{s<=t} exp(G_t - G_s) (q_t.k_s) u_s.
    """
    q, k, v = (t.transpose(0, 1) for t in (q, k, v))       # [H, L, d]
    g, beta = g.t(), beta.t()                               # [H, L]
    cum = g.cumsum(-1)
    length = q.shape[1]
    decay = cum.unsqueeze(-1) - cum.unsqueeze(-2)           # [H, L, L]: G_t - G_s
    lower = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    decay = torch.where(lower, decay, torch.full_like(decay, float("-inf"))).exp()
    strict = torch.eye(length, dtype=torch.bool, device=q.device).logical_not() & lower
    system = torch.where(strict, beta.unsqueeze(-1) * (k @ k.transpose(-1, -2)) * decay, torch.zeros_like(decay))
    system = system + torch.eye(length, dtype=q.dtype, device=q.device)
    rhs = beta.unsqueeze(-1) * (v - (cum.exp().unsqueeze(-1) * k) @ s)
    u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    scores = (q @ k.transpose(-1, -2)) * decay               # includes the diagonal
    out = (cum.exp().unsqueeze(-1) * q) @ s + scores @ u
    last = cum[:, -1:]
    new_s = last.exp().unsqueeze(-1) * s + ((last - cum).exp().unsqueeze(-1) * k).transpose(-1, -2) @ u
    return out.transpose(0, 1), new_s


# ---- gated RMSNorm (norm, then gate) --------------------------------------------------------------
def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * rmsnorm(x) * silu(gate)`` with a plain ``weight`` (not 1 + w), float32 inside."""
    dtype = x.dtype
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return ((weight * normed.to(dtype)) * F.silu(gate.float())).to(dtype)


OPS = (("causal_conv1d_prefill", causal_conv1d_prefill), ("causal_conv1d_decode", causal_conv1d_decode),
       ("gated_delta_rule_prefill", gated_delta_rule_prefill), ("gated_delta_rule_decode", gated_delta_rule_decode),
       ("gated_rms_norm", gated_rms_norm))
