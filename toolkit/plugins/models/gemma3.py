"""Gemma 3 (text): interleaved sliding-window and global attention, each with its own rotary base.

Differences from the Llama layout, all read from the config (never from the file format):
norms are ``x * (1 + w)`` in float32; four norms per layer, the attention and MLP outputs
normed before the residual add ("sandwich"); per-head q/k norms; ``layer_types`` picks
sliding or full attention per layer, sliding layers use ``rope_local_base_freq`` unscaled
and full layers ``rope_theta`` with the configured scaling; attention scale is
``query_pre_attn_scalar ** -0.5``; embeddings are multiplied by ``sqrt(hidden_size)``;
optional tanh soft-capping of the final logits; tied embeddings by default.

``attn_logit_softcapping`` is read but not applied: Gemma 3 replaced Gemma 2's score
soft-capping with the q/k norms, every published config sets it to null, and transformers'
Gemma 3 attention never applies it either; matching transformers is the contract.

Configs come in three vocabularies, all accepted: transformers 5 (``rope_parameters`` with
``full_attention``/``sliding_attention`` sub-dicts, ``layer_types``), transformers 4
(``rope_theta``, ``rope_local_base_freq``, ``rope_scaling``, ``sliding_window_pattern``),
and the multimodal ``Gemma3ForConditionalGeneration`` config whose ``text_config`` lists
only what differs from the Gemma3TextConfig defaults. Of a multimodal checkpoint only the
language model is loaded (see Gemma3SafetensorsNames).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from toolkit.core.arch import ModelArch
from toolkit.core.config import ModelConfig, base_fields, eos_ids
from toolkit.core import validate as v
from toolkit.core.errors import CheckpointError
from toolkit.core.layers import AttentionMetadata, RMSNorm
from toolkit.core.names import HFNameMap, MappedName, NameContext

from .decoder import PACKED_MODULES, AttentionOptions, CausalLM, DecoderAttention, DecoderModel, GatedMLP, add_norm

SLIDING, FULL = "sliding_attention", "full_attention"
NORM_OFFSET = 1.0  # Gemma stores w and scales by (1 + w)

# transformers' Gemma3TextConfig defaults: a multimodal config's sparse text_config relies on them.
TEXT_DEFAULTS: dict[str, Any] = dict(
    vocab_size=262_208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
    num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131_072,
    rms_norm_eps=1e-6, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True, query_pre_attn_scalar=256,
    sliding_window=4096)
DEFAULT_GLOBAL_THETA, DEFAULT_LOCAL_THETA = 1_000_000.0, 10_000.0
DEFAULT_SLIDING_PATTERN = 6  # every 6th layer global, as transformers assumes for old configs


@dataclass
class Gemma3Config(ModelConfig):
    """ModelConfig plus Gemma 3's per-layer attention choices.

    ``rope_theta``/``rope_scaling`` (inherited) are the full-attention layers' rotary settings;
    ``rope_local_theta``/``rope_local_scaling`` the sliding layers'.
    """

    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    rope_local_theta: float = DEFAULT_LOCAL_THETA
    rope_local_scaling: dict[str, Any] | None = None
    query_pre_attn_scalar: float = 256.0
    attn_logit_softcap: float | None = None  # recorded, not applied (see the module docstring)
    final_logit_softcap: float | None = None


# ---- config ------------------------------------------------------------------------------
def text_config(hf_config: dict) -> dict:
    """The language model's config in flat HF vocabulary (unwraps a multimodal ``text_config``)."""
    nested = hf_config.get("text_config")
    if not nested:
        return hf_config
    shared = {key: hf_config[key] for key in ("bos_token_id", "tie_word_embeddings", "torch_dtype", "dtype")
              if hf_config.get(key) is not None}
    merged = {**TEXT_DEFAULTS, **shared, **nested}
    if hf_config.get("eos_token_id") is not None:  # the top level carries the chat end-of-turn ids
        merged["eos_token_id"] = hf_config["eos_token_id"]
    return merged


def config_from(hf_config: dict) -> Gemma3Config:
    hf = text_config(hf_config)
    if hf.get("use_bidirectional_attention"):
        raise CheckpointError("Gemma 3 with use_bidirectional_attention (an embedding model) is not a causal LM "
                              "and is not supported", file="config")
    fields = base_fields(hf, "gemma3")
    rope = rope_by_layer_type(hf)
    fields.update(
        hidden_act=hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh",
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        eos_token_ids=eos_ids(hf.get("eos_token_id")),
        rope_theta=rope[FULL][0], rope_scaling=rope[FULL][1],
    )
    return Gemma3Config(
        **fields, layer_types=layer_types(hf, fields["num_layers"]), sliding_window=hf.get("sliding_window"),
        rope_local_theta=rope[SLIDING][0], rope_local_scaling=rope[SLIDING][1],
        query_pre_attn_scalar=v.real(hf.get("query_pre_attn_scalar") or TEXT_DEFAULTS["query_pre_attn_scalar"],
                                     key="query_pre_attn_scalar", file="config"),
        attn_logit_softcap=hf.get("attn_logit_softcapping"), final_logit_softcap=hf.get("final_logit_softcapping"))


def layer_types(hf: dict, num_layers: int) -> tuple[str, ...]:
    """``layer_types`` if given, else every ``sliding_window_pattern``-th layer is global."""
    given = hf.get("layer_types")
    if given:
        if len(given) != num_layers or set(given) - {SLIDING, FULL}:
            raise CheckpointError(f"layer_types must list {num_layers} entries of {SLIDING!r}/{FULL!r}, "
                                  f"got {given!r}", file="config")
        return tuple(given)
    pattern = int(hf.get("sliding_window_pattern") or DEFAULT_SLIDING_PATTERN)
    return tuple(SLIDING if (i + 1) % pattern else FULL for i in range(num_layers))


def rope_by_layer_type(hf: dict) -> dict[str, tuple[float, dict | None]]:
    """(theta, scaling or None) for each layer type, from either config vocabulary."""
    params = hf.get("rope_parameters") or {}
    if FULL in params or SLIDING in params:  # transformers 5: one sub-dict per layer type
        full, local = params.get(FULL) or {}, params.get(SLIDING) or {}
    else:  # transformers 4: flat keys; a flat rope_parameters/rope_scaling applies to global layers only
        full = {**params, **(hf.get("rope_scaling") or {})}
        full.setdefault("rope_theta", hf.get("rope_theta"))
        local = {"rope_theta": hf.get("rope_local_base_freq")}
    return {FULL: (float(full.get("rope_theta") or DEFAULT_GLOBAL_THETA), _scaling(full)),
            SLIDING: (float(local.get("rope_theta") or DEFAULT_LOCAL_THETA), _scaling(local))}


def _scaling(params: dict) -> dict | None:
    kind = params.get("rope_type") or params.get("type")
    if kind in (None, "default"):
        return None
    return {key: value for key, value in params.items() if key not in ("rope_theta", "type")} | {"rope_type": kind}


# ---- model -------------------------------------------------------------------------------
class Gemma3DecoderLayer(nn.Module):
    """x + post_attn_norm(attn(input_norm(x))), then x + post_ff_norm(mlp(pre_ff_norm(x)))."""

    def __init__(self, config: Gemma3Config, options: AttentionOptions, *, quant, parallel, prefix: str):
        super().__init__()
        self.input_layernorm = _norm(config, quant)
        self.self_attn = DecoderAttention(config, options, quant=quant, parallel=parallel, prefix=f"{prefix}.self_attn")
        self.post_attention_layernorm = _norm(config, quant)
        self.pre_feedforward_layernorm = _norm(config, quant)
        self.mlp = GatedMLP(config, quant=quant, parallel=parallel, prefix=f"{prefix}.mlp")
        self.post_feedforward_layernorm = _norm(config, quant)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None,
                attn: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """``-> (hidden, residual)``: both residual adds are the ones fused into the next norm
        (the pre-feedforward norm here, the next layer's input norm or the final norm after)."""
        normed, residual = add_norm(self.input_layernorm, hidden, residual, self.self_attn)
        attended = self.post_attention_layernorm(self.self_attn(positions, normed, attn))
        normed, residual = self.pre_feedforward_layernorm.forward_add(attended, residual, self.mlp)
        return self.post_feedforward_layernorm(self.mlp(normed)), residual


def _norm(config: Gemma3Config, quant) -> RMSNorm:
    return RMSNorm(config.hidden_size, config.rms_norm_eps, weight_offset=NORM_OFFSET, dtype=quant.params_dtype)


def attention_options(config: Gemma3Config) -> dict[str, AttentionOptions]:
    """One AttentionOptions per layer type: only the window and the rotary settings differ."""
    shared = dict(qk_norm=True, norm_offset=NORM_OFFSET, qkv_bias=config.attention_bias,
                  scale=config.query_pre_attn_scalar ** -0.5)
    return {SLIDING: AttentionOptions(**shared, sliding_window=config.sliding_window,
                                      rope_theta=config.rope_local_theta, rope_scaling=config.rope_local_scaling),
            FULL: AttentionOptions(**shared, rope_theta=config.rope_theta, rope_scaling=config.rope_scaling)}


def build(config: Gemma3Config, quant, parallel) -> CausalLM:
    options = attention_options(config)

    def make_layer(index: int, prefix: str) -> Gemma3DecoderLayer:
        return Gemma3DecoderLayer(config, options[config.layer_types[index]], quant=quant, parallel=parallel,
                                  prefix=prefix)

    model = DecoderModel(config, make_layer, quant=quant, parallel=parallel, norm_offset=NORM_OFFSET,
                         embed_scale=config.hidden_size ** 0.5)
    return CausalLM(config, model, quant=quant, parallel=parallel, final_logit_softcap=config.final_logit_softcap)


# ---- multimodal checkpoints: load the language model only -------------------------------
# (prefix in the checkpoint, canonical prefix); transformers 4 and 5 nest the text model differently.
LANGUAGE_MODEL_PREFIXES = (("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
                           ("model.language_model.", "model."))
NON_TEXT_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


@dataclass(frozen=True)
class Gemma3SafetensorsNames:
    """HF names, with a Gemma3ForConditionalGeneration's language model unwrapped and its vision
    tower and projector skipped (text generation does not use them)."""

    format: str = "safetensors"
    architecture: str = "gemma3"

    def map(self, name: str, context: NameContext) -> MappedName | None:
        if name.startswith(NON_TEXT_PREFIXES):
            return None
        for prefix, canonical in LANGUAGE_MODEL_PREFIXES:
            if name.startswith(prefix):
                name = canonical + name[len(prefix):]
                break
        return HFNameMap(self.format).map(name, context)


GEMMA3 = ModelArch(name="gemma3", config_from=config_from, build=build, packed_modules=PACKED_MODULES,
                   aliases=("Gemma3ForCausalLM", "gemma3_text", "Gemma3ForConditionalGeneration"))
GEMMA3_NAMES = Gemma3SafetensorsNames()
