"""Qwen2 (q/k/v biases) and Qwen3 (per-head q/k RMSNorm, no biases)."""
from __future__ import annotations

from toolkit.core.arch import ModelArch
from toolkit.core.config import ModelConfig, base_fields

from .decoder import PACKED_MODULES, AttentionOptions, CausalLM, DecoderModel, LlamaDecoderLayer


def _builder(*, qkv_bias: bool | None, qk_norm: bool):
    def build(config: ModelConfig, quant, parallel) -> CausalLM:
        options = AttentionOptions(qkv_bias=config.attention_bias if qkv_bias is None else qkv_bias, qk_norm=qk_norm,
                                   rope_theta=config.rope_theta, rope_scaling=config.rope_scaling)

        def make_layer(index: int, prefix: str):
            return LlamaDecoderLayer(config, options, quant=quant, parallel=parallel, prefix=prefix)

        return CausalLM(config, DecoderModel(config, make_layer, quant=quant, parallel=parallel), quant=quant,
                        parallel=parallel)

    return build


def qwen2_config(hf_config: dict) -> ModelConfig:
    return ModelConfig(**base_fields(hf_config, "qwen2"))


def qwen3_config(hf_config: dict) -> ModelConfig:
    return ModelConfig(**base_fields(hf_config, "qwen3"))


QWEN2 = ModelArch(name="qwen2", config_from=qwen2_config, build=_builder(qkv_bias=True, qk_norm=False),
                  packed_modules=PACKED_MODULES, aliases=("Qwen2ForCausalLM",))
QWEN3 = ModelArch(name="qwen3", config_from=qwen3_config, build=_builder(qkv_bias=None, qk_norm=True),
                  packed_modules=PACKED_MODULES, aliases=("Qwen3ForCausalLM",))
