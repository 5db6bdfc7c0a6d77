"""Qwen3.5 and Qwen3-Next: hybrid decoders of Gated DeltaNet layers and gated full attention.

Read from the config, never assumed: ``layer_types`` lists ``linear_attention`` (Gated
DeltaNet, see gated_deltanet.py) or ``full_attention`` per layer (a config without it but with
``full_attention_interval`` gets transformers' rule for that key). Full attention is gated:
``q_proj`` yields per head ``[query | gate]`` and the attention output is multiplied by
``sigmoid(gate)`` before ``o_proj``; per-head q/k RMSNorm; rotary on the first
``partial_rotary_factor * head_dim`` features. Every RMSNorm except the GDN's gated one is
zero-centred (``x * (1 + w)``).

Qwen3.5's rotary is multimodal (MRoPE); for text all three position streams are the same
position, which is ordinary RoPE. Of a ``Qwen3_5ForConditionalGeneration`` checkpoint only the
language model (``model.language_model.``) is loaded; the vision tower is skipped.
Multi-token-prediction weights (``mtp.*``) are skipped: they only serve speculative decoding,
which toolkit does not do.

Mixture of experts: Qwen3-Next's MLP is sparse on the layers ``MoEConfig.is_sparse`` picks
(``num_experts``, ``decoder_sparse_step``, ``mlp_only_layers``; renormalised top-k when
``norm_topk_prob``) and Qwen3.5-MoE's on every layer (always renormalised); both have a shared
expert behind a sigmoid gate. The sparse block is the MoE plugin's ``SparseMoEBlock`` and the
expert names its ``MoENameMap`` (per-expert or stacked), composed here, not copied.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from toolkit.core.arch import ModelArch
from toolkit.core.config import base_fields, eos_ids
from toolkit.core.errors import CheckpointError, MissingMetadataError
from toolkit.core.layers import (Attention, AttentionMetadata, QKVParallelLinear, RMSNorm, RotaryEmbedding,
                                 RowParallelLinear)
from toolkit.core.names import MappedName, NameContext
from toolkit.core.params import require_divisible

from .decoder import PACKED_MODULES, CausalLM, DecoderModel, GatedMLP, add_norm
from .gated_deltanet import IN_PROJ_MEMBERS, GatedDeltaNet
from .qwen3_next_layout import Qwen3NextHFNamer
from .moe import EXPERT_COUNT_KEYS, MoEConfig, MoENameMap, SparseMoEBlock, moe_fields

LINEAR, FULL = "linear_attention", "full_attention"
NORM_OFFSET = 1.0
DEFAULT_PARTIAL_ROTARY = 0.25  # transformers' default for both families
HYBRID_PACKED = {**PACKED_MODULES, "in_proj": IN_PROJ_MEMBERS}


@dataclass
class HybridConfig(MoEConfig):
    """MoEConfig (no experts for a dense model) plus the hybrid layer kinds and GDN sizes."""

    layer_types: tuple[str, ...] = ()
    partial_rotary_factor: float = DEFAULT_PARTIAL_ROTARY
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4


# ---- config ------------------------------------------------------------------------------
def text_config(hf: dict) -> dict:
    """A Qwen3_5ForConditionalGeneration config keeps the language model in ``text_config``."""
    nested = hf.get("text_config")
    if not nested:
        return hf
    shared = {key: hf[key] for key in ("tie_word_embeddings", "torch_dtype", "dtype", "eos_token_id",
                                       "bos_token_id") if hf.get(key) is not None}
    return {**shared, **nested}


def layer_types(hf: dict, num_layers: int) -> tuple[str, ...]:
    given = hf.get("layer_types")
    if given is None and hf.get("full_attention_interval"):
        interval = int(hf["full_attention_interval"])
        given = [LINEAR if (i + 1) % interval else FULL for i in range(num_layers)]
    if given is None:
        raise MissingMetadataError("a hybrid config needs layer_types (or full_attention_interval)", file="config")
    if len(given) != num_layers or set(given) - {LINEAR, FULL}:
        raise CheckpointError(f"layer_types must list {num_layers} entries of {LINEAR!r}/{FULL!r}, got {given!r}",
                              file="config")
    return tuple(given)


def config_from_hf(family: str, hf_config: dict) -> HybridConfig:
    """The ``family`` ("qwen3_5", "qwen3_next" or "qwen3_5_moe") config from an HF-vocabulary dict."""
    return _builder_config(family)(hf_config)


def _builder_config(family: str):
    def config_from(hf_config: dict) -> HybridConfig:
        hf = text_config(hf_config)
        experts = _expert_fields(family, hf)
        if family == "qwen3_5_moe" and hf.get("intermediate_size") is None:
            # no dense MLP in this family; raw stays the checkpoint's (a writer must not store a made-up size)
            fields = {**base_fields({**hf, "intermediate_size": experts["moe_intermediate_size"]}, family), "raw": hf}
        else:
            fields = base_fields(hf, family)
        fields["eos_token_ids"] = eos_ids(hf.get("eos_token_id"))
        rope = hf.get("rope_parameters") or {}
        partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", DEFAULT_PARTIAL_ROTARY))
        types = layer_types(hf, fields["num_layers"])
        return HybridConfig(**fields, **experts, layer_types=types, partial_rotary_factor=float(partial),
                            linear_num_key_heads=int(hf.get("linear_num_key_heads", 16)),
                            linear_num_value_heads=int(hf.get("linear_num_value_heads", 32)),
                            linear_key_head_dim=int(hf.get("linear_key_head_dim", 128)),
                            linear_value_head_dim=int(hf.get("linear_value_head_dim", 128)),
                            linear_conv_kernel_dim=int(hf.get("linear_conv_kernel_dim", 4)))

    return config_from


def _expert_fields(family: str, hf: dict) -> dict:
    """The MoEConfig fields: none for dense Qwen3.5 or a Qwen3-Next without experts (its
    ``mlp_only_layers`` then mean nothing); Qwen3.5-MoE is sparse on every layer and, like
    transformers' router for it, always renormalises."""
    if family == "qwen3_5" or (family == "qwen3_next" and not any(hf.get(key) for key in EXPERT_COUNT_KEYS)):
        return {}
    fields = moe_fields(hf, norm_topk_default=True)  # Qwen3NextConfig's default
    if family == "qwen3_5_moe":
        fields.update(norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=())
    return fields


# ---- model -------------------------------------------------------------------------------
class GatedAttention(nn.Module):
    """Full attention whose q_proj also yields a sigmoid output gate per head."""

    def __init__(self, config: HybridConfig, *, quant, parallel, prefix: str):
        super().__init__()
        hd, dtype = config.head_dim, quant.params_dtype
        require_divisible(config.num_heads, parallel.tp_size, f"{prefix} attention heads")
        # q_proj rows are [query | gate] per head: as 2 * heads "heads" they split by whole pairs
        self.qkv_proj = QKVParallelLinear(config.hidden_size, hd, 2 * config.num_heads, config.num_kv_heads,
                                          quant=quant, parallel=parallel, prefix=f"{prefix}.qkv_proj")
        self.o_proj = RowParallelLinear(config.num_heads * hd, config.hidden_size, quant=quant, parallel=parallel,
                                        prefix=f"{prefix}.o_proj")
        self.q_norm = RMSNorm(hd, config.rms_norm_eps, weight_offset=NORM_OFFSET, dtype=dtype)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps, weight_offset=NORM_OFFSET, dtype=dtype)
        self.rotary = RotaryEmbedding(hd, base=config.rope_theta, scaling=config.rope_scaling,
                                      rotary_dim=int(hd * config.partial_rotary_factor))
        self.num_heads, self.head_dim = self.qkv_proj.num_heads // 2, hd
        self.attn = Attention(self.num_heads, self.qkv_proj.num_kv_heads, hd, scale=hd ** -0.5)

    def int8_input(self, tokens: int):
        """What the block reads of its input (the q/k/v projection's need; ``kernels/int8_blocks.py``)."""
        return self.qkv_proj.int8_input(tokens)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, attn: AttentionMetadata) -> torch.Tensor:
        tokens, hd = hidden.shape[0], self.head_dim
        query_gate, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        query_gate = query_gate.reshape(tokens, self.num_heads, 2 * hd)
        q, gate = query_gate[..., :hd], query_gate[..., hd:].reshape(tokens, -1)
        q = self.q_norm(q).reshape(tokens, -1)
        k = self.k_norm(k.reshape(tokens, -1, hd)).reshape(tokens, -1)
        attended = self.attn(q, k, v, attn, rotary=self.rotary, positions=positions)  # rotary (+ KV store) inside
        return self.o_proj(attended * torch.sigmoid(gate))


class HybridDecoderLayer(nn.Module):
    """x + mixer(norm(x)), then x + mlp(norm(x)); the mixer is GDN or gated attention per layer_types."""

    def __init__(self, config: HybridConfig, index: int, *, quant, parallel, prefix: str):
        super().__init__()
        dtype = quant.params_dtype
        self.is_linear = config.layer_types[index] == LINEAR
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, weight_offset=NORM_OFFSET, dtype=dtype)
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(config, quant=quant, parallel=parallel, prefix=f"{prefix}.linear_attn")
        else:
            self.self_attn = GatedAttention(config, quant=quant, parallel=parallel, prefix=f"{prefix}.self_attn")
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, weight_offset=NORM_OFFSET,
                                                dtype=dtype)
        block = SparseMoEBlock if config.is_sparse(index) else GatedMLP
        self.mlp = block(config, quant=quant, parallel=parallel, prefix=f"{prefix}.mlp")

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None,
                attn: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """``-> (hidden, residual)`` as the decoder's ``LlamaDecoderLayer.forward``."""
        mixer = self.linear_attn if self.is_linear else self.self_attn
        normed, residual = add_norm(self.input_layernorm, hidden, residual, mixer)
        mixed = self.linear_attn(normed, attn) if self.is_linear else self.self_attn(positions, normed, attn)
        normed, residual = self.post_attention_layernorm.forward_add(mixed, residual, self.mlp)
        return self.mlp(normed), residual


def build(config: HybridConfig, quant, parallel) -> CausalLM:
    def make_layer(index: int, prefix: str) -> HybridDecoderLayer:
        return HybridDecoderLayer(config, index, quant=quant, parallel=parallel, prefix=prefix)

    model = DecoderModel(config, make_layer, quant=quant, parallel=parallel, norm_offset=NORM_OFFSET)
    return CausalLM(config, model, quant=quant, parallel=parallel)


# ---- checkpoint names --------------------------------------------------------------------
LANGUAGE_MODEL_PREFIX, CANONICAL_PREFIX = "model.language_model.", "model."
SKIPPED_PREFIXES = ("mtp.", "model.mtp.", "model.visual.", "visual.")


@dataclass(frozen=True)
class HybridSafetensorsNames:
    """HF names; a multimodal checkpoint's language model unwrapped, vision and MTP weights skipped,
    expert tensors (per-expert or stacked) through the MoE plugin's map."""

    architecture: str
    format: str = "safetensors"

    def map(self, name: str, context: NameContext) -> MappedName | None:
        if name.startswith(SKIPPED_PREFIXES):
            return None
        if name.startswith(LANGUAGE_MODEL_PREFIX):
            name = CANONICAL_PREFIX + name[len(LANGUAGE_MODEL_PREFIX):]
        return MoENameMap(self.format, self.architecture).map(name, context)

    def hf_namer(self, config: HybridConfig):
        """What a Hugging Face writer passes tensors through (Qwen3-Next re-fuses in_proj_qkvz)."""
        return Qwen3NextHFNamer(config) if self.architecture == "qwen3_next" else None


QWEN3_5 = ModelArch(name="qwen3_5", config_from=_builder_config("qwen3_5"), build=build, packed_modules=HYBRID_PACKED,
                    aliases=("Qwen3_5ForCausalLM", "qwen3_5_text", "Qwen3_5ForConditionalGeneration", "qwen3_5"))
QWEN3_NEXT = ModelArch(name="qwen3_next", config_from=_builder_config("qwen3_next"), build=build,
                       packed_modules=HYBRID_PACKED, aliases=("Qwen3NextForCausalLM",))
QWEN3_5_MOE = ModelArch(name="qwen3_5_moe", config_from=_builder_config("qwen3_5_moe"), build=build,
                        packed_modules=HYBRID_PACKED,
                        aliases=("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", "Qwen3_5MoeForConditionalGeneration",
                                 "qwen3_5_moe"))
HYBRID_ARCHS = (QWEN3_5, QWEN3_NEXT, QWEN3_5_MOE)
QWEN3_5_NAMES, QWEN3_NEXT_NAMES, QWEN3_5_MOE_NAMES = (HybridSafetensorsNames(arch.name) for arch in HYBRID_ARCHS)
