"""Rotary position embedding (rotate-half layout) with default, linear and llama3 frequency scaling.

Frequencies are computed from the positions on every call (cheap next to attention), so no
table sized by max_position_embeddings is ever allocated. Formats whose files store q/k rows
in another rotary layout undo that in their name map; no model file branches on it.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ...kernels import runtime
from ...kernels.split_sums import SplitSums, as_parts
from ..errors import InvalidConfigError

# rope_type -> the scaling keys it needs (each a positive number); config_checks validates against this
SCALING_KEYS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def inverse_frequencies(rotary_dim: int, base: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        return _llama3(inv_freq, scaling)
    raise InvalidConfigError(f"rope scaling type {kind!r} is not supported (supported: {', '.join(SCALING_KEYS)})",
                             key="rope_scaling")


def _llama3(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1: long wavelengths slowed by ``factor``, short kept, a smooth ramp between."""
    factor, low, high = float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    original = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, *, base: float, scaling: dict | None = None, rotary_dim: int | None = None):
        super().__init__()
        self.head_dim, self.rotary_dim = head_dim, rotary_dim or head_dim
        device = torch.empty(0).device  # the build's device (models are built under ``with torch.device(...)``)
        if device.type == "meta":
            # a build for names and shapes only (convert's): the values are never read, and the first
            # arithmetic on meta tensors imports torch's Python meta kernels (dynamo, sympy: seconds)
            inv_freq = torch.empty(self.rotary_dim // 2)
        else:
            # computed on the host and copied: on a GPU, computing them there took ~6 kernel launches
            # per layer during the build, the first of which also loaded those kernels
            with torch.device("cpu"):
                inv_freq = inverse_frequencies(self.rotary_dim, base, scaling).to(device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [tokens, heads * head_dim], k: [tokens, kv_heads * head_dim]; returns rotated copies."""
        return runtime.call("rotary_qk", positions, q, k, self.inv_freq, self.head_dim, self.rotary_dim)

    def forward_store(self, positions: torch.Tensor, q: torch.Tensor | SplitSums, k: torch.Tensor | SplitSums,
                      v: torch.Tensor | SplitSums, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, qk_norm: tuple[nn.Module, nn.Module] | None = None) -> torch.Tensor:
        """Rotated q, with the rotated k and v written into paged caches at ``slot_mapping``, as one op
        (a kernel launch fewer than rotating, then storing). v: [tokens, kv_heads * head_dim].

        ``qk_norm``: per-head RMSNorms (``q_norm``, ``k_norm``, sharing eps and weight offset) applied
        to q and k first, in the same op (on CUDA the same kernel). q, k and v may be a projection's split-K
        partial sums (``kernels/split_sums.py``), added up in the same op too."""
        split = [x for x in (q, k, v) if isinstance(x, SplitSums)]
        if split:
            norm = None if qk_norm is None else (qk_norm[0].weight, qk_norm[1].weight, qk_norm[0].eps,
                                                 qk_norm[0].weight_offset)
            return runtime.call("rotary_store_kv_splits", positions, as_parts(q), as_parts(k), as_parts(v),
                                split[0].dtype, self.inv_freq, self.head_dim, self.rotary_dim, k_cache, v_cache,
                                slot_mapping, norm)
        if qk_norm is None:
            return runtime.call("rotary_store_kv", positions, q, k, v, self.inv_freq, self.head_dim, self.rotary_dim,
                                k_cache, v_cache, slot_mapping)
        q_norm, k_norm = qk_norm
        return runtime.call("qk_norm_rotary_store_kv", positions, q, k, v, q_norm.weight, k_norm.weight, q_norm.eps,
                            q_norm.weight_offset, self.inv_freq, self.head_dim, self.rotary_dim, k_cache, v_cache,
                            slot_mapping)
