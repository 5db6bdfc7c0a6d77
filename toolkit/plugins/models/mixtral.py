"""Mixtral: Llama attention, every layer sparse, top-k weights always renormalised.

Its checkpoints call the block ``block_sparse_moe`` and the expert projections ``w1`` (gate),
``w3`` (up) and ``w2`` (down); the name map renames them, the model is the shared MoE decoder.
"""
from __future__ import annotations

from toolkit.core.arch import ModelArch
from toolkit.core.config import base_fields

from .decoder import PACKED_MODULES, AttentionOptions, CausalLM, DecoderModel
from .moe import MIXTRAL_EXPERT_LEAVES, MoEConfig, MoEDecoderLayer, MoENameMap, moe_fields


def config_from(hf_config: dict) -> MoEConfig:
    fields = moe_fields(hf_config, expert_size_key="intermediate_size")
    return MoEConfig(**base_fields(hf_config, "mixtral"), **{**fields, "norm_topk_prob": True,
                                                             "decoder_sparse_step": 1, "mlp_only_layers": ()})


def build(config: MoEConfig, quant, parallel) -> CausalLM:
    options = AttentionOptions(qkv_bias=config.attention_bias, rope_theta=config.rope_theta,
                               rope_scaling=config.rope_scaling, sliding_window=config.raw.get("sliding_window"))

    def make_layer(index: int, prefix: str):
        return MoEDecoderLayer(config, options, index=index, quant=quant, parallel=parallel, prefix=prefix)

    return CausalLM(config, DecoderModel(config, make_layer, quant=quant, parallel=parallel), quant=quant,
                    parallel=parallel)


MIXTRAL = ModelArch(name="mixtral", config_from=config_from, build=build, packed_modules=PACKED_MODULES,
                    aliases=("MixtralForCausalLM",))
MIXTRAL_NAMES = MoENameMap(format="safetensors", architecture="mixtral", expert_leaves=MIXTRAL_EXPERT_LEAVES,
                           block_names={"block_sparse_moe": "mlp"})
