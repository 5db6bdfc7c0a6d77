"""bitsandbytes 4-bit (NF4/FP4) mixture-of-experts weights, quantized on the fly: the reference path.

Experts arrive as dense stacked parameters (the unquantized scheme's ``[E, out, in]`` layout,
sharded the same way); once the layer is complete each expert's matrix is quantized with
``bitsandbytes.functional.quantize_4bit`` and the dense copy is released. ``apply_moe`` runs the
shared ``expert_mixture`` loop with ``bnb_4bit_matmul`` (bitsandbytes' ``matmul_4bit``) per expert.

Peak memory while loading holds the dense experts until the layer's ``process_after_loading``.
"""
from __future__ import annotations

import torch
from torch import nn

from toolkit.core.params import ModelParameter
from toolkit.kernels import runtime
from toolkit.kernels.moe import expert_mixture, gated

from .dense import DenseParameter


def create_dense_experts(layer: nn.Module, dtype: torch.dtype, *, num_experts: int, hidden_size: int,
                         intermediate_size_per_partition: int) -> None:
    inter, shards = intermediate_size_per_partition, layer.expert_shard_ids
    layer.gate_up_proj = DenseParameter(torch.zeros(num_experts, 2 * inter, hidden_size, dtype=dtype), output_dim=1,
                                        input_dim=2, shard_ids=shards["gate_up_proj"])
    layer.down_proj = DenseParameter(torch.zeros(num_experts, hidden_size, inter, dtype=dtype), output_dim=1,
                                     input_dim=2, shard_ids=shards["down_proj"])


def quantize_experts(layer: nn.Module, options) -> None:
    """Each expert's gate_up and down as (packed bytes, QuantState); the dense data is dropped."""
    from .blocks import quantize_packed  # noqa: PLC0415 - imports bitsandbytes

    for name in ("gate_up_proj", "down_proj"):
        param: ModelParameter = getattr(layer, name)
        if param.numel() == 0:  # already quantized
            continue
        packed = [quantize_packed(expert, quant_type=options.quant_type, block_size=options.block_size,
                                  double_quant=options.double_quant) for expert in param.data]
        setattr(layer, f"{name}_4bit", packed)
        param.data = param.data.new_empty(0)


def apply_experts(layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor) -> torch.Tensor:
    gate_up, down = layer.gate_up_proj_4bit, layer.down_proj_4bit

    def expert_fn(expert: int, rows: torch.Tensor) -> torch.Tensor:
        hidden = gated(runtime.call("bnb_4bit_matmul", rows, *gate_up[expert], None), layer.activation)
        return runtime.call("bnb_4bit_matmul", hidden, *down[expert], None)

    return expert_mixture(x, topk_weights, topk_ids, len(gate_up), expert_fn)


__all__ = ["apply_experts", "create_dense_experts", "quantize_experts"]
