"""Qwen3-Next's fused Gated DeltaNet input projection, written back in transformers' layout.

A Qwen3-Next checkpoint stores ``linear_attn.in_proj_qkvz`` interleaved per key head
(``[q_h, k_h, v_h..., z_h...]``, see gated_deltanet.py); llama.cpp stores it as contiguous
``attn_qkv`` + ``attn_gate``, which our GGUF map reads as the members ``in_proj_qkv`` /
``in_proj_z``. Writing a Hugging Face checkpoint from such a source, this namer holds each
layer's two halves until both arrived and emits the interleaved ``in_proj_qkvz`` that
transformers' ``Qwen3NextForCausalLM`` reads. ``in_proj_ba`` needs nothing: llama.cpp keeps its
interleaved order (``ssm_ba``).
"""
from __future__ import annotations

import re

import torch

from toolkit.core.errors import ConversionError

from .gated_deltanet import GDNDims

_HALF = re.compile(r"^(?P<module>model\.layers\.\d+\.linear_attn)\.in_proj_(?P<half>qkv|z)\.weight$")


class Qwen3NextHFNamer:
    """``to_files(name, tensor)`` -> the (name, tensor) pairs to write; ``check_done()`` at the end."""

    def __init__(self, config):
        self.dims = GDNDims.of(config)
        self.pending: dict[str, dict[str, torch.Tensor]] = {}

    def to_files(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        match = _HALF.match(name)
        if match is None:
            return [(name, tensor)]
        halves = self.pending.setdefault(match["module"], {})
        halves[match["half"]] = tensor
        if len(halves) < 2:
            return []
        del self.pending[match["module"]]
        return [(f"{match['module']}.in_proj_qkvz.weight", self.interleave(halves["qkv"], halves["z"]))]

    def interleave(self, qkv: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Contiguous [q | k | v] and z -> per key head [q_h, k_h, v_h..., z_h...]."""
        d, hidden = self.dims, qkv.shape[-1]
        kh, kd, vd = d.num_k_heads, d.num_k_heads * d.head_k_dim, d.num_v_heads * d.head_v_dim
        if qkv.shape[0] != 2 * kd + vd or z.shape[0] != vd:
            raise ConversionError(f"Gated DeltaNet projection rows {qkv.shape[0]} + {z.shape[0]} do not match "
                                  f"{kh} key heads x {d.head_k_dim} and {d.num_v_heads} value heads x {d.head_v_dim}")
        q, k, v = qkv.split([kd, kd, vd])
        per_head = [part.reshape(kh, -1, hidden) for part in (q, k, v, z)]
        return torch.cat(per_head, dim=1).reshape(-1, hidden)

    def check_done(self) -> None:
        if self.pending:
            raise ConversionError(f"Gated DeltaNet projections missing their qkv or z half: {sorted(self.pending)}")
