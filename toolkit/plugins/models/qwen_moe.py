"""Qwen2-MoE (q/k/v biases, a shared expert behind a sigmoid gate, ``norm_topk_prob`` off by default)
and Qwen3-MoE (per-head q/k RMSNorm, no shared expert)."""
from __future__ import annotations

from toolkit.core.arch import ModelArch
from toolkit.core.config import base_fields

from .decoder import PACKED_MODULES, AttentionOptions, CausalLM, DecoderModel
from .moe import MoEConfig, MoEDecoderLayer, MoENameMap, moe_fields


def _builder(*, qwen3: bool):
    def build(config: MoEConfig, quant, parallel) -> CausalLM:
        bias = config.attention_bias if qwen3 else bool(config.raw.get("qkv_bias", True))
        options = AttentionOptions(qkv_bias=bias, qk_norm=qwen3, rope_theta=config.rope_theta,
                                   rope_scaling=config.rope_scaling)

        def make_layer(index: int, prefix: str):
            return MoEDecoderLayer(config, options, index=index, quant=quant, parallel=parallel, prefix=prefix)

        return CausalLM(config, DecoderModel(config, make_layer, quant=quant, parallel=parallel), quant=quant,
                        parallel=parallel)

    return build


def qwen2_moe_config(hf_config: dict) -> MoEConfig:
    return MoEConfig(**base_fields(hf_config, "qwen2_moe"), **moe_fields(hf_config))


def qwen3_moe_config(hf_config: dict) -> MoEConfig:
    return MoEConfig(**base_fields(hf_config, "qwen3_moe"), **moe_fields(hf_config))


QWEN2_MOE = ModelArch(name="qwen2_moe", config_from=qwen2_moe_config, build=_builder(qwen3=False),
                      packed_modules=PACKED_MODULES, aliases=("Qwen2MoeForCausalLM",))
QWEN3_MOE = ModelArch(name="qwen3_moe", config_from=qwen3_moe_config, build=_builder(qwen3=True),
                      packed_modules=PACKED_MODULES, aliases=("Qwen3MoeForCausalLM",))

QWEN2_MOE_NAMES = MoENameMap(format="safetensors", architecture="qwen2_moe")
QWEN3_MOE_NAMES = MoENameMap(format="safetensors", architecture="qwen3_moe")
