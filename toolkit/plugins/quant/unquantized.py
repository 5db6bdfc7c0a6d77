"""The unquantized scheme: plain fp32 / fp16 / bf16 weights and torch matmuls."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.core.hookspecs import hookimpl
from toolkit.core.params import ModelParameter
from toolkit.kernels import runtime


class UnquantizedScheme:
    name = "unquantized"

    def __init__(self, params_dtype: torch.dtype):
        self.params_dtype = params_dtype

    def scheme_for(self, *, layer_kind: str, prefix: str) -> "UnquantizedScheme":
        return self

    def create_weights(self, layer: nn.Module, *, input_size_per_partition: int, output_partition_sizes: list[int],
                       input_size: int, output_size: int) -> None:
        # zeros, not empty: vocab padding rows must never hold garbage
        data = torch.zeros(sum(output_partition_sizes), input_size_per_partition, dtype=self.params_dtype)
        layer.weight = ModelParameter(data, output_dim=0, input_dim=1, shard_ids=layer.shard_ids)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x.to(self.params_dtype), layer.weight, bias)

    def embed(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, layer.weight)

    def create_moe_weights(self, layer: nn.Module, *, num_experts: int, hidden_size: int,
                           intermediate_size_per_partition: int) -> None:
        """Stacked experts: ``gate_up_proj`` [E, 2I, H] (gate rows, then up rows), ``down_proj`` [E, H, I]."""
        inter = intermediate_size_per_partition
        shards = layer.expert_shard_ids
        layer.gate_up_proj = ModelParameter(torch.zeros(num_experts, 2 * inter, hidden_size, dtype=self.params_dtype),
                                            output_dim=1, input_dim=2, shard_ids=shards["gate_up_proj"])
        layer.down_proj = ModelParameter(torch.zeros(num_experts, hidden_size, inter, dtype=self.params_dtype),
                                         output_dim=1, input_dim=2, shard_ids=shards["down_proj"])

    def apply_moe(self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor) -> torch.Tensor:
        return runtime.call("fused_moe", x.to(self.params_dtype), layer.gate_up_proj, layer.down_proj, topk_weights,
                            topk_ids, layer.activation)

    def process_after_loading(self, layer: nn.Module) -> None:
        return None


class UnquantizedFactory:
    names = ("unquantized",)

    def from_checkpoint(self, quant_metadata, *, params_dtype: torch.dtype) -> UnquantizedScheme:
        return UnquantizedScheme(params_dtype)

    def from_spec(self, spec: str, *, params_dtype: torch.dtype) -> UnquantizedScheme:
        return UnquantizedScheme(params_dtype)


@hookimpl
def register_quant_schemes(register):
    register(UnquantizedFactory())
