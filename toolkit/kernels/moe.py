"""Mixture-of-experts ops (torch reference): routing and the fused expert computation.

- ``moe_route(router_logits, top_k, renormalize) -> (topk_weights float32 [T, k], topk_ids int64 [T, k])``:
  softmax over experts in float32, the top ``k``, optionally renormalised to sum to 1.
- ``fused_moe(x, gate_up, down, topk_weights, topk_ids, activation) -> [T, hidden]``: for every
  token, ``sum_k w_k * down_e(act(gate_e(x)) * up_e(x))`` over its chosen experts ``e``, with
  ``gate_up`` ``[E, 2I, H]`` and ``down`` ``[E, H, I]`` plain tensors.

``expert_mixture`` is the loop both share with packed formats: it gathers the tokens routed to
each expert and calls ``expert_fn(expert, rows) -> [rows, hidden]``, so a packed format's reference
only supplies how one expert's weights multiply (dequantized one expert at a time).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..core.hookspecs import hookimpl
from .triton_support import lazy_ops

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"silu": F.silu}


def moe_route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def gated(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """``act(gate) * up`` of a ``[rows, 2I]`` gate-then-up product."""
    gate, up = gate_up.chunk(2, dim=-1)
    return ACTIVATIONS[activation](gate) * up


def expert_mixture(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                   expert_fn: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``out[t] = sum_k topk_weights[t, k] * expert_fn(topk_ids[t, k], x[t])``, one expert at a time.

    The weights are applied in the activation dtype after each expert, as transformers does.
    """
    out = torch.zeros_like(x)
    flat_ids = topk_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    start = 0
    for expert, count in enumerate(counts):
        if count:
            picked = order[start:start + count]
            tokens = picked // topk_ids.shape[1]
            rows = expert_fn(expert, x[tokens])
            weight = topk_weights.reshape(-1)[picked].to(x.dtype).unsqueeze(-1)
            out.index_add_(0, tokens, (rows * weight).to(out.dtype))
        start += count
    return out


def fused_moe(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    def expert_fn(expert: int, rows: torch.Tensor) -> torch.Tensor:
        return F.linear(gated(F.linear(rows, gate_up[expert]), activation), down[expert])

    return expert_mixture(x, topk_weights, topk_ids, gate_up.shape[0], expert_fn)


@hookimpl
def register_kernels(register):
    register("moe_route", moe_route, device="any")
    register("fused_moe", fused_moe, device="any")
    for name, fn in lazy_ops("toolkit.kernels.moe_triton", ("fused_moe", "moe_route"), "Triton fused MoE").items():
        register(name, fn, device="cuda", priority=10)
