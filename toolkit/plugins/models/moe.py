"""What mixture-of-experts decoders share: config fields, the sparse block, the decoder layer and
the Hugging Face name map for expert tensors.

Parameter names follow transformers 5's in-memory layout: ``mlp.gate.weight`` (router),
``mlp.experts.gate_up_proj`` ``[E, 2I, H]`` and ``mlp.experts.down_proj`` ``[E, H, I]``,
``mlp.shared_expert.*`` and ``mlp.shared_expert_gate.weight``. A checkpoint may store experts
one by one (``mlp.experts.{e}.gate_proj.weight``, what ``save_pretrained`` writes by default) or
stacked (``save_original_format=False``); ``MoENameMap`` maps both, from data tables.

Which layers are sparse: layer ``i`` is, unless it is in ``mlp_only_layers``, when there are
experts and ``(i + 1) % decoder_sparse_step == 0`` (the others get a dense gated MLP).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Mapping

import torch
from torch import nn

from toolkit.core.config import ModelConfig, require
from toolkit.core.layers import RMSNorm
from toolkit.core.layers.moe import FusedMoE, MoERouter
from toolkit.core.names import MappedName, NameContext, map_hf_name
from toolkit.kernels import runtime
from toolkit.kernels.int8_blocks import merge

from .decoder import AttentionOptions, DecoderAttention, GatedMLP, add_norm


@dataclass
class MoEConfig(ModelConfig):
    """ModelConfig plus the expert fields (``intermediate_size`` stays the dense MLP's)."""

    num_experts: int = 0
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    shared_expert_intermediate_size: int = 0
    expert_parallel: bool = False  # config.json key ``expert_parallel``: whole experts per rank at tp > 1

    def is_sparse(self, layer: int) -> bool:
        return (layer not in self.mlp_only_layers and self.num_experts > 0
                and (layer + 1) % self.decoder_sparse_step == 0)


# transformers 5 writes ``num_local_experts`` for every family; older Qwen configs say ``num_experts``
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts")


def moe_fields(hf_config: dict, *, expert_size_key: str = "moe_intermediate_size",
               norm_topk_default: bool = False) -> dict:
    """The MoEConfig fields read from HF vocabulary (keys differ between families)."""
    count_key = next((key for key in EXPERT_COUNT_KEYS if hf_config.get(key) is not None), EXPERT_COUNT_KEYS[-1])
    return dict(
        num_experts=int(require(hf_config, count_key)),
        num_experts_per_tok=int(require(hf_config, "num_experts_per_tok")),
        moe_intermediate_size=int(require(hf_config, expert_size_key)),
        norm_topk_prob=bool(hf_config.get("norm_topk_prob", norm_topk_default)),
        decoder_sparse_step=int(hf_config.get("decoder_sparse_step") or 1),
        mlp_only_layers=tuple(hf_config.get("mlp_only_layers") or ()),
        shared_expert_intermediate_size=int(hf_config.get("shared_expert_intermediate_size") or 0),
        expert_parallel=bool(hf_config.get("expert_parallel", False)),
    )


class SparseMoEBlock(nn.Module):
    """Router -> top-k -> fused experts (+ a shared expert behind a sigmoid gate, Qwen2-MoE)."""

    def __init__(self, config: MoEConfig, *, quant, parallel, prefix: str):
        super().__init__()
        dtype = quant.params_dtype
        self.top_k, self.renormalize = config.num_experts_per_tok, config.norm_topk_prob
        self.gate = MoERouter(config.hidden_size, config.num_experts, dtype=dtype)
        self.experts = FusedMoE(config.num_experts, config.hidden_size, config.moe_intermediate_size, quant=quant,
                                parallel=parallel, prefix=f"{prefix}.experts", activation=config.hidden_act,
                                expert_parallel=config.expert_parallel)
        self.shared_expert = None
        if config.shared_expert_intermediate_size:
            shared = dataclasses.replace(config, intermediate_size=config.shared_expert_intermediate_size)
            self.shared_expert = GatedMLP(shared, quant=quant, parallel=parallel, prefix=f"{prefix}.shared_expert")
            self.shared_expert_gate = MoERouter(config.hidden_size, 1, dtype=dtype)

    def int8_input(self, tokens: int):
        """What the experts (and a shared expert) read of the block's input (``kernels/int8_blocks.py``);
        the router reads it as it is."""
        shared = self.shared_expert.int8_input(tokens) if self.shared_expert is not None else None
        return merge(self.experts.int8_input(tokens, self.top_k), shared)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = runtime.call("moe_route", self.gate(x), self.top_k, self.renormalize)
        out = self.experts(x, weights, ids)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out


class MoEDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + (sparse or dense) mlp(norm(x))."""

    def __init__(self, config: MoEConfig, options: AttentionOptions, *, index: int, quant, parallel, prefix: str):
        super().__init__()
        dtype = quant.params_dtype
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        self.self_attn = DecoderAttention(config, options, quant=quant, parallel=parallel, prefix=f"{prefix}.self_attn")
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        block = SparseMoEBlock if config.is_sparse(index) else GatedMLP
        self.mlp = block(config, quant=quant, parallel=parallel, prefix=f"{prefix}.mlp")

    def forward(self, positions, hidden, residual, attn):
        """``-> (hidden, residual)`` as ``LlamaDecoderLayer.forward``."""
        normed, residual = add_norm(self.input_layernorm, hidden, residual, self.self_attn)
        attended = self.self_attn(positions, normed, attn, unreduced=True)     # the norm adds split-K sums
        normed, residual = self.post_attention_layernorm.forward_add(attended, residual, self.mlp)
        return self.mlp(normed), residual


# ---- Hugging Face names ---------------------------------------------------------------------------
# per-expert leaf -> (stacked parameter, shard id): the gated MLP's convention, gate 0 and up 1
QWEN_EXPERT_LEAVES = {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
                      "down_proj": ("down_proj", None)}
MIXTRAL_EXPERT_LEAVES = {"w1": ("gate_up_proj", 0), "w3": ("gate_up_proj", 1), "w2": ("down_proj", None)}
STACKED_LEAVES = ("gate_up_proj", "down_proj")  # transformers' fused 3-D names (gate rows, then up rows)

_PER_EXPERT = re.compile(r"^(?P<layer>model\.layers\.\d+)\.(?P<block>\w+)\.experts\.(?P<expert>\d+)\."
                         r"(?P<leaf>\w+)\.weight$")
_STACKED = re.compile(r"^(?P<layer>model\.layers\.\d+)\.(?P<block>\w+)\.experts\.(?P<leaf>\w+)$")
_BLOCK = re.compile(r"^(?P<layer>model\.layers\.\d+)\.(?P<block>\w+)\.(?P<rest>.+)$")


@dataclass(frozen=True)
class MoENameMap:
    """Hugging Face names of one MoE family onto the model, as data.

    :param expert_leaves: per-expert leaf -> (stacked parameter, shard id)
    :param block_names: the family's name for the MLP block -> ours (Mixtral's ``block_sparse_moe``)
    """

    format: str
    architecture: str
    expert_leaves: Mapping[str, tuple[str, int | None]] = dataclasses.field(
        default_factory=lambda: QWEN_EXPERT_LEAVES)
    block_names: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def map(self, name: str, context: NameContext) -> MappedName | None:
        match = _PER_EXPERT.match(name)
        if match and match["leaf"] in self.expert_leaves:
            target, shard = self.expert_leaves[match["leaf"]]
            return MappedName(f"{match['layer']}.mlp.experts.{target}", shard, expert_id=int(match["expert"]))
        match = _STACKED.match(name)
        if match and match["leaf"] in STACKED_LEAVES:
            return MappedName(f"{match['layer']}.mlp.experts.{match['leaf']}")
        match = _BLOCK.match(name)
        if match and match["block"] in self.block_names:
            name = f"{match['layer']}.{self.block_names[match['block']]}.{match['rest']}"
        return map_hf_name(name, context)
