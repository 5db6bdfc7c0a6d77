"""Pure-torch reference ops: the oracle for every faster kernel, and what runs on CPU.

Registered for ``device="any"`` through the ``register_kernels`` hook like any plugin.
"""
from __future__ import annotations

import torch

from ..core.hookspecs import hookimpl
from . import runtime
from .int8_blocks import quantize_reference
from .split_sums import sum_splits_reference as sum_splits
from .recurrent_reference import OPS as RECURRENT_OPS


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0) -> torch.Tensor:
    """``x / rms(x) * (weight_offset + weight)``, normalised in float32 like transformers."""
    dtype = x.dtype
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    if weight_offset:
        return (normed * (weight_offset + weight.float())).to(dtype)
    return weight * normed.to(dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 weight_offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``: a residual add and the next norm as one op."""
    total = x + residual
    return rms_norm(total, weight, eps, weight_offset), total


def gated_activation(x: torch.Tensor, activation: str) -> torch.Tensor:
    """``act(gate) * up`` for ``x = [gate | up]`` along the last dim (a gated MLP's middle)."""
    gate, up = x.chunk(2, dim=-1)
    return GATED_ACTIVATIONS[activation](gate) * up


def rms_norm_int8(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float, sums: bool):
    """``rms_norm`` and its output rounded to int8 blocks (``int8_blocks``): ``(out, words, scales, sums or None)``."""
    out = rms_norm(x, weight, eps, weight_offset)
    return (out, *quantize_reference(out.reshape(-1, out.shape[-1]), sums))


def add_rms_norm_int8(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                      weight_offset: float, sums: bool):
    """``add_rms_norm`` and the normalised output's int8 blocks: ``(out, total, words, scales, sums or None)``."""
    out, total = add_rms_norm(x, residual, weight, eps, weight_offset)
    return (out, total, *quantize_reference(out.reshape(-1, out.shape[-1]), sums))


def gated_activation_int8(x: torch.Tensor, activation: str, sums: bool):
    """``gated_activation`` and its output's int8 blocks: ``(out, words, scales, sums or None)``."""
    out = gated_activation(x, activation)
    return (out, *quantize_reference(out.reshape(-1, out.shape[-1]), sums))


def add_rms_norm_splits(parts: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                        weight_offset: float, sums: bool | None):
    """``add_rms_norm`` (``_int8`` unless ``sums`` is None) of split-K partial sums ``parts [S, T, N]``
    (``split_sums``), added up in residual's dtype first: ``(out, total, words, scales, block sums)``, the last three
    None without ``sums``."""
    x = sum_splits(parts, residual.dtype)
    if sums is None:
        return (*add_rms_norm(x, residual, weight, eps, weight_offset), None, None, None)
    return add_rms_norm_int8(x, residual, weight, eps, weight_offset, sums)


def gated_activation_splits(parts: torch.Tensor, dtype: torch.dtype, activation: str, sums: bool | None):
    """``gated_activation`` (``_int8`` unless ``sums`` is None) of split-K partial sums ``parts [S, T, 2N]``, added up
    in ``dtype`` first: ``(out, words, scales, block sums)``, the last three None without ``sums``."""
    x = sum_splits(parts, dtype)
    if sums is None:
        return gated_activation(x, activation), None, None, None
    return gated_activation_int8(x, activation, sums)


GATED_ACTIVATIONS = {"silu": torch.nn.functional.silu,
                     "gelu_pytorch_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
                     "gelu": torch.nn.functional.gelu}


def rotary_qk(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, inv_freq: torch.Tensor, head_dim: int,
              rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate-half RoPE of q and k at ``positions`` (angles ``position * inv_freq`` in float32)."""
    freqs = positions.float().unsqueeze(-1) * inv_freq.to(positions.device).unsqueeze(0)
    angles = torch.cat((freqs, freqs), dim=-1)
    cos, sin = angles.cos(), angles.sin()
    return rotary(q, cos, sin, head_dim, rotary_dim), rotary(k, cos, sin, head_dim, rotary_dim)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, rotary_dim: int) -> torch.Tensor:
    """Rotate-half RoPE on the first ``rotary_dim`` features of every head. x: [T, heads * head_dim]."""
    tokens = x.shape[0]
    heads = x.view(tokens, -1, head_dim)
    rot, passthrough = heads[..., :rotary_dim], heads[..., rotary_dim:]
    half = rotary_dim // 2
    rotated_half = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    cos, sin = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
    out = torch.cat((rot * cos + rotated_half * sin, passthrough), dim=-1)
    return out.reshape(tokens, -1)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write each new token's K/V at its slot; slots < 0 are padding and skipped."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k[keep].to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep].to(v_cache.dtype)


def rotary_store_kv(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    inv_freq: torch.Tensor, head_dim: int, rotary_dim: int, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """``rotary_qk`` then ``store_kv`` of the rotated k and of v; returns the rotated q.

    q: [T, heads * head_dim], k and v: [T, kv_heads * head_dim] (rows may be strided: views of one
    qkv output); the caches are [blocks, block_size, kv_heads, head_dim]. The rotated k is only
    written into the cache: paged attention reads it from there.
    """
    q_rot, k_rot = rotary_qk(positions, q, k, inv_freq, head_dim, rotary_dim)
    tokens = q.shape[0]
    store_kv(k_rot.view(tokens, -1, head_dim), v.view(tokens, -1, head_dim), k_cache, v_cache, slot_mapping)
    return q_rot


def qk_norm_rotary_store_kv(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float, weight_offset: float,
                            inv_freq: torch.Tensor, head_dim: int, rotary_dim: int, k_cache: torch.Tensor,
                            v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """Per-head ``rms_norm`` of q (``q_weight``) and k (``k_weight``), as Qwen3's and Gemma 3's
    ``q_norm``/``k_norm``, then ``rotary_store_kv``; returns the rotated q. One op so that a device
    kernel can do it in one pass; here its parts go through the runtime (a CPU's compiled norm and
    rotary kernels still serve them)."""
    tokens = q.shape[0]
    q = runtime.call("rms_norm", q.reshape(tokens, -1, head_dim), q_weight, eps, weight_offset).reshape(tokens, -1)
    k = runtime.call("rms_norm", k.reshape(tokens, -1, head_dim), k_weight, eps, weight_offset).reshape(tokens, -1)
    return runtime.call("rotary_store_kv", positions, q, k, v, inv_freq, head_dim, rotary_dim, k_cache, v_cache,
                        slot_mapping)


def rotary_store_kv_splits(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           dtype: torch.dtype, inv_freq: torch.Tensor, head_dim: int, rotary_dim: int,
                           k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                           norm: tuple | None) -> torch.Tensor:
    """``rotary_store_kv`` (``qk_norm_rotary_store_kv`` with ``norm = (q_weight, k_weight, eps, weight_offset)``)
    of q, k and v given as partial sums ``[S, T, N]`` (``split_sums.as_parts``; S = 1 is the value itself), each
    added up in ``dtype`` first; returns the rotated q."""
    q, k, v = (sum_splits(parts, dtype) for parts in (q, k, v))
    if norm is None:
        return runtime.call("rotary_store_kv", positions, q, k, v, inv_freq, head_dim, rotary_dim, k_cache, v_cache,
                            slot_mapping)
    return runtime.call("qk_norm_rotary_store_kv", positions, q, k, v, *norm, inv_freq, head_dim, rotary_dim,
                        k_cache, v_cache, slot_mapping)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
           scale: float, sliding_window: int | None, softcap: float | None) -> torch.Tensor:
    """Causal (optionally windowed, soft-capped) attention for one sequence.

    q: [Lq, H, D], k/v: [Lk, KVH, D]; a query at position p sees keys at positions in
    (p - sliding_window, p]. Softmax in float32.
    """
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1).float()
    v = v.repeat_interleave(groups, dim=1).float()
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    visible = k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)
    if sliding_window:
        visible &= k_pos.unsqueeze(0) > q_pos.unsqueeze(1) - sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(q.dtype)


def varlen_attention(q, k, v, attn, scale: float, sliding_window=None, softcap=None) -> torch.Tensor:
    """Each sequence attends over its own new tokens only (no KV cache)."""
    out = torch.empty_like(q)
    starts = attn.query_start_loc.tolist()
    for begin, end in zip(starts[:-1], starts[1:]):
        pos = torch.arange(end - begin, device=q.device)
        out[begin:end] = attend(q[begin:end], k[begin:end], v[begin:end], pos, pos, scale, sliding_window, softcap)
    return out


def paged_attention(q, k_cache, v_cache, attn, scale: float, sliding_window=None, softcap=None) -> torch.Tensor:
    """New tokens of each sequence attend over that sequence's whole cached context."""
    if attn.max_query_len == 1:
        return paged_decode(q, k_cache, v_cache, attn, scale, sliding_window, softcap)
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    starts, seq_lens = attn.query_start_loc.tolist(), attn.seq_lens.tolist()
    for i, (begin, end) in enumerate(zip(starts[:-1], starts[1:])):
        context = seq_lens[i]
        blocks = attn.block_tables[i, : (context + block_size - 1) // block_size].long()
        k = k_cache[blocks].reshape(-1, *k_cache.shape[2:])[:context]
        v = v_cache[blocks].reshape(-1, *v_cache.shape[2:])[:context]
        k_pos = torch.arange(context, device=q.device)
        q_pos = k_pos[context - (end - begin):]
        out[begin:end] = attend(q[begin:end], k, v, q_pos, k_pos, scale, sliding_window, softcap)
    return out


def paged_attention_int8(q, k_cache, v_cache, attn, scale: float, sliding_window, softcap, sums: bool):
    """``paged_attention`` and its output's int8 blocks, each token's ``[heads * head_dim]`` row rounded
    (``kernels/int8_blocks.py``): ``(out, words, scales, block sums or None)``. A device kernel may return None
    for the blocks where it does not write them; the reader then rounds the output itself."""
    out = runtime.call("paged_attention", q, k_cache, v_cache, attn, scale, sliding_window, softcap)
    return (out, *quantize_reference(out.reshape(out.shape[0], -1), sums))


def paged_decode(q, k_cache, v_cache, attn, scale: float, sliding_window=None, softcap=None) -> torch.Tensor:
    """``paged_attention`` when every sequence has exactly one new token: all sequences at once,
    each over its context gathered from its blocks and padded to the longest (padding masked)."""
    block_size, groups = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
    context = int(attn.seq_lens.max())
    tables = attn.block_tables[:, : (context + block_size - 1) // block_size].long().clamp(min=0)
    k = k_cache[tables].flatten(1, 2).repeat_interleave(groups, dim=2).float()  # [seqs, context, heads, dim]
    v = v_cache[tables].flatten(1, 2).repeat_interleave(groups, dim=2).float()
    scores = torch.einsum("shd,skhd->shk", q.float(), k) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    k_pos = torch.arange(k.shape[1], device=q.device).unsqueeze(0)
    q_pos = (attn.seq_lens.long() - 1).unsqueeze(1)
    visible = k_pos <= q_pos
    if sliding_window:
        visible &= k_pos > q_pos - sliding_window
    scores = scores.masked_fill(~visible.unsqueeze(1), float("-inf"))
    return torch.einsum("shk,skhd->shd", scores.softmax(-1), v).to(q.dtype)


@hookimpl
def register_kernels(register):
    for name, fn in (("rms_norm", rms_norm), ("add_rms_norm", add_rms_norm), ("gated_activation", gated_activation),
                     ("rms_norm_int8", rms_norm_int8), ("add_rms_norm_int8", add_rms_norm_int8),
                     ("gated_activation_int8", gated_activation_int8), ("sum_splits", sum_splits),
                     ("add_rms_norm_splits", add_rms_norm_splits), ("gated_activation_splits", gated_activation_splits),
                     ("rotary_store_kv_splits", rotary_store_kv_splits),
                     ("rotary_qk", rotary_qk), ("rotary", rotary), ("store_kv", store_kv),
                     ("rotary_store_kv", rotary_store_kv), ("qk_norm_rotary_store_kv", qk_norm_rotary_store_kv),
                     ("varlen_attention", varlen_attention), ("paged_attention", paged_attention),
                     ("paged_attention_int8", paged_attention_int8),
                     *RECURRENT_OPS):
        register(name, fn, device="any")
