"""Mixture-of-experts layers: a router and the experts as stacked parameters.

Experts are ordinary parameters with one more leading dimension: ``gate_up_proj`` is
``[experts, 2 * intermediate, hidden]`` (gate rows, then up rows) and ``down_proj`` is
``[experts, hidden, intermediate]``, created by the quant scheme (``create_moe_weights``) and
computed by it (``apply_moe``, which calls the ``fused_moe`` ops of the kernel registry).

Tensor parallelism splits every expert's intermediate dimension (gate/up rows, down columns),
exactly like a gated MLP, and all-reduces the result. Expert parallelism (``expert_parallel``)
gives each rank whole experts instead: rank r owns experts ``[r * E / tp, (r + 1) * E / tp)``,
tokens routed elsewhere contribute zero on this rank, and the same all-reduce sums the ranks.

A checkpoint tensor reaches ``load_weight`` (it stacks every expert) or ``load_expert_weight``
(it holds one). Shard ids follow the gated MLP: gate 0, up 1, None for gate and up stacked in
one tensor (gate first). None of this branches on format or scheme.
"""
from __future__ import annotations

import torch
from torch import nn

from ...kernels.int8_blocks import scheme_request
from ..errors import ShapeMismatchError, ToolkitError
from ..params import ModelParameter, Placement, require_divisible
from ..parallel import ParallelContext
from ..quant import QuantScheme


class MoERouter(nn.Module):
    """A small replicated linear map kept in the activation dtype (never quantized: top-k choices
    are sensitive to it). Also serves a shared expert's one-output sigmoid gate."""

    def __init__(self, input_size: int, output_size: int, *, dtype: torch.dtype):
        super().__init__()
        self.weight = ModelParameter(torch.zeros(output_size, input_size, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x.to(self.weight.dtype), self.weight)


class FusedMoE(nn.Module):
    """Routed experts. ``forward(x, topk_weights, topk_ids)`` -> ``[tokens, hidden]`` (all-reduced).

    :param num_experts: experts in the checkpoint
    :param intermediate_size: one expert's intermediate size (before tensor-parallel splitting)
    :param expert_parallel: give ranks whole experts instead of splitting each expert
    """

    layer_kind = "moe"

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *, quant: QuantScheme,
                 parallel: ParallelContext, prefix: str, activation: str = "silu", expert_parallel: bool = False):
        super().__init__()
        tp, rank = parallel.tp_size, parallel.tp_rank
        self.num_experts, self.hidden_size, self.activation = num_experts, hidden_size, activation
        self.parallel, self.prefix, self.expert_parallel = parallel, prefix, expert_parallel
        if expert_parallel:
            self.num_local_experts = require_divisible(num_experts, tp, f"{prefix} experts")
            self.first_expert, self.intermediate_size, self.tp_slice = rank * self.num_local_experts, \
                intermediate_size, (0, 1)
        else:
            self.num_local_experts, self.first_expert = num_experts, 0
            self.intermediate_size = require_divisible(intermediate_size, tp, f"{prefix} expert intermediate size")
            self.tp_slice = (rank, tp)
        self.full_intermediate_size = intermediate_size
        local = range(self.num_local_experts)
        self.expert_shard_ids = {"gate_up_proj": tuple((e, s) for e in local for s in (0, 1)),
                                 "down_proj": tuple((e, None) for e in local)}
        self.scheme = quant.scheme_for(layer_kind=self.layer_kind, prefix=prefix)
        if not hasattr(self.scheme, "create_moe_weights"):
            raise ToolkitError(f"{prefix}: quantization scheme {self.scheme.name!r} has no mixture-of-experts "
                               "weights (create_moe_weights/apply_moe)")
        self.scheme.create_moe_weights(self, num_experts=self.num_local_experts, hidden_size=hidden_size,
                                       intermediate_size_per_partition=self.intermediate_size)

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        if self.expert_parallel and self.parallel.tp_size > 1:
            topk_weights, topk_ids = self._local_routes(topk_weights, topk_ids)
        return self.parallel.all_reduce(self.scheme.apply_moe(self, x, topk_weights, topk_ids))

    def int8_input(self, tokens: int, top_k: int):
        """What the scheme's experts read of x for ``tokens`` rows routed to ``top_k`` experts each
        (``kernels/int8_blocks.py``), or None. Asked once per token count (after loading)."""
        return scheme_request(self, "moe_int8_input", tokens, top_k)

    def _local_routes(self, topk_weights, topk_ids):
        """Routes to other ranks' experts get weight 0 (and a valid local id) on this rank."""
        local = topk_ids - self.first_expert
        mine = (local >= 0) & (local < self.num_local_experts)
        return topk_weights * mine, torch.where(mine, local, torch.zeros_like(local))

    # ---- loading ----------------------------------------------------------------------------
    def load_weight(self, param_name: str, loaded, shard_id: int | None) -> None:
        """A tensor stacking every expert (``[experts, out, in]``)."""
        for local in range(self.num_local_experts):
            self._place(param_name, loaded, shard_id, local, self.first_expert + local)

    def load_expert_weight(self, param_name: str, loaded, *, shard_id: int | None, expert_id: int) -> None:
        """One expert's tensor (``[out, in]``); experts another rank owns are skipped."""
        if not 0 <= expert_id < self.num_experts:
            raise ShapeMismatchError(f"{self.prefix}: expert {expert_id} of a layer with {self.num_experts} experts")
        local = expert_id - self.first_expert
        if 0 <= local < self.num_local_experts:
            self._place(param_name, loaded, shard_id, local, None)

    def _place(self, param_name: str, loaded, shard_id, local: int, source_expert: int | None) -> None:
        param = getattr(self, param_name, None)
        if param_name not in self.expert_shard_ids or param is None:
            raise ShapeMismatchError(f"{self.prefix} has no expert parameter {param_name!r}")
        rank, _ = self.tp_slice
        size, full = self.intermediate_size, self.full_intermediate_size
        if param_name == "down_proj":
            param.load_expert(loaded, Placement("input", rank * size, size, 0, (local, None), local, source_expert))
            return
        for part in (0, 1) if shard_id is None else (shard_id,):
            # stacked gate+up: up starts after the whole gate; a single gate or up tensor starts at 0
            start = rank * size + (part * full if shard_id is None else 0)
            param.load_expert(loaded, Placement("output", start, size, part * size, (local, part), local,
                                                source_expert))
