"""Llama (Llama 2/3, Mistral, SmolLM and other Llama-layout models)."""
from __future__ import annotations

from toolkit.core.arch import ModelArch
from toolkit.core.config import ModelConfig, base_fields

from .decoder import PACKED_MODULES, AttentionOptions, CausalLM, DecoderModel, LlamaDecoderLayer


def config_from(hf_config: dict) -> ModelConfig:
    return ModelConfig(**base_fields(hf_config, "llama"))


def build(config: ModelConfig, quant, parallel) -> CausalLM:
    options = AttentionOptions(qkv_bias=config.attention_bias, rope_theta=config.rope_theta,
                               rope_scaling=config.rope_scaling, sliding_window=config.raw.get("sliding_window"))

    def make_layer(index: int, prefix: str):
        return LlamaDecoderLayer(config, options, quant=quant, parallel=parallel, prefix=prefix)

    return CausalLM(config, DecoderModel(config, make_layer, quant=quant, parallel=parallel), quant=quant,
                    parallel=parallel)


LLAMA = ModelArch(name="llama", config_from=config_from, build=build, packed_modules=PACKED_MODULES,
                  aliases=("LlamaForCausalLM", "MistralForCausalLM", "mistral"))
