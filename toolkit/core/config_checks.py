"""Checks of a checkpoint's config, before any model is built.

Two passes, both in Hugging Face vocabulary (what every loader produces, so every architecture,
including ones added later, gets them through the shared pipeline):

* :func:`check_hf_config` checks the raw dict's well-known keys (types and ranges) so that an
  architecture's ``config_from`` never meets a list where it expects a size;
* :func:`check_model_config` checks the ModelConfig ``config_from`` produced (consistency
  between fields, supported rope scaling, token ids inside the vocabulary, and the numeric
  fields of architecture subclasses).

Format-specific checks (a format's own key names and types) live in the loader plugins.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from . import validate as v
from .config import ModelConfig
from .errors import InvalidConfigError
from .layers.rotary import SCALING_KEYS

# HF key -> (minimum, maximum) of integer sizes; each checked when present and not null
HF_SIZES: dict[str, tuple[int, int]] = {
    "vocab_size": (1, v.MAX_SIZE), "hidden_size": (1, v.MAX_SIZE), "intermediate_size": (1, v.MAX_SIZE),
    "num_hidden_layers": (1, v.MAX_LAYERS), "num_attention_heads": (1, v.MAX_HEADS),
    "num_key_value_heads": (1, v.MAX_HEADS), "head_dim": (1, 1 << 16),
    "max_position_embeddings": (1, v.MAX_POSITIONS), "sliding_window": (0, v.MAX_POSITIONS),  # 0: off (Qwen2-MoE)
}
HF_POSITIVE_REALS = ("rms_norm_eps", "rope_theta")
HF_FLAGS = ("tie_word_embeddings", "attention_bias")
HF_TEXTS = ("hidden_act", "hidden_activation", "model_type")
HF_TOKEN_IDS = ("bos_token_id", "eos_token_id")  # pad_token_id is never used (old configs write -1)
HF_MAPPINGS = ("rope_scaling", "rope_parameters", "quantization_config")
NESTED = ("text_config",)  # multimodal configs keep the language model's keys here


def check_hf_config(hf: Any, *, file: str | None) -> dict:
    """The raw config dict, its well-known keys checked; InvalidConfigError naming file and key."""
    hf = v.mapping(hf, key="(config)", file=file)
    _check_hf_keys(hf, file, prefix="")
    for key in NESTED:
        if hf.get(key) is not None:
            _check_hf_keys(v.mapping(hf[key], key=key, file=file), file, prefix=f"{key}.")
    if hf.get("architectures") is not None:
        v.texts(hf["architectures"], key="architectures", file=file, max_items=64)
    return hf


def _check_hf_keys(hf: Mapping, file: str | None, *, prefix: str) -> None:
    present = {key: value for key, value in hf.items() if value is not None}
    for key, (low, high) in HF_SIZES.items():
        if key in present:
            v.integer(present[key], key=prefix + key, file=file, minimum=low, maximum=high)
    for keys, check in ((HF_POSITIVE_REALS, v.real), (HF_FLAGS, v.flag), (HF_TEXTS, v.text),
                        (HF_TOKEN_IDS, v.integers), (HF_MAPPINGS, v.mapping)):
        for key in keys:
            if key in present:
                check(present[key], key=prefix + key, file=file)


def check_model_config(config: ModelConfig, *, file: str | None) -> ModelConfig:
    """Field types and ranges, heads vs KV heads, rope scaling, token ids in the vocabulary."""
    f = file
    v.integer(config.vocab_size, key="vocab_size", file=f)
    v.integer(config.hidden_size, key="hidden_size", file=f)
    v.integer(config.intermediate_size, key="intermediate_size", file=f)
    v.integer(config.num_layers, key="num_hidden_layers", file=f, maximum=v.MAX_LAYERS)
    heads = v.integer(config.num_heads, key="num_attention_heads", file=f, maximum=v.MAX_HEADS)
    kv_heads = v.integer(config.num_kv_heads, key="num_key_value_heads", file=f, maximum=heads)
    if heads % kv_heads:
        raise InvalidConfigError(f"{heads} attention heads cannot share {kv_heads} KV heads evenly",
                                 file=f, key="num_key_value_heads")
    head_dim = v.integer(config.head_dim, key="head_dim", file=f, maximum=1 << 16)
    if head_dim % 2:
        raise InvalidConfigError(f"head_dim {head_dim} is odd; rotary embeddings rotate pairs", file=f, key="head_dim")
    v.real(config.rms_norm_eps, key="rms_norm_eps", file=f, maximum=1.0)
    v.real(config.rope_theta, key="rope_theta", file=f)
    check_rope_scaling(config.rope_scaling, key="rope_scaling", file=f)
    v.integer(config.max_position_embeddings, key="max_position_embeddings", file=f, maximum=v.MAX_POSITIONS)
    v.flag(config.tie_word_embeddings, key="tie_word_embeddings", file=f)
    v.flag(config.attention_bias, key="attention_bias", file=f)
    v.text(config.hidden_act, key="hidden_act", file=f)
    if config.bos_token_id is not None:
        v.integer(config.bos_token_id, key="bos_token_id", file=f, minimum=0, maximum=config.vocab_size - 1)
    v.integers(list(config.eos_token_ids), key="eos_token_id", file=f, maximum=config.vocab_size - 1,
               allow_scalar=False)
    if config.torch_dtype is not None:
        v.text(config.torch_dtype, key="torch_dtype", file=f)
    _check_extra_fields(config, f)
    return config


def check_rope_scaling(scaling: Any, *, key: str, file: str | None) -> None:
    """None, or a mapping with a supported ``rope_type`` and each number that type needs, positive."""
    if scaling is None:
        return
    scaling = v.mapping(scaling, key=key, file=file)
    kind = v.choice(scaling.get("rope_type", "default"), SCALING_KEYS, key=f"{key}.rope_type", file=file)
    for name in SCALING_KEYS[kind]:
        if scaling.get(name) is None:
            raise InvalidConfigError(f"rope scaling {kind!r} needs {name!r}", file=file, key=key)
        v.real(scaling[name], key=f"{key}.{name}", file=file)
    if kind == "llama3" and float(scaling["high_freq_factor"]) <= float(scaling["low_freq_factor"]):
        raise InvalidConfigError("llama3 rope scaling needs high_freq_factor > low_freq_factor", file=file, key=key)


BASE_FIELDS = {field.name for field in dataclasses.fields(ModelConfig)}


def _check_extra_fields(config: ModelConfig, file: str | None) -> None:
    """Fields an architecture's subclass adds: numbers finite and not negative, ``*_scaling`` rope dicts.
    (An architecture checks its own fields' tighter ranges, e.g. a scale that must be > 0.)"""
    for field in dataclasses.fields(config):
        if field.name in BASE_FIELDS:
            continue
        value = getattr(config, field.name)
        if value is None or isinstance(value, (str, bool)):
            continue
        if field.name.endswith("_scaling"):
            check_rope_scaling(value, key=field.name, file=file)
        elif isinstance(value, float):
            v.real(value, key=field.name, file=file, inclusive=True)
        elif isinstance(value, int):
            v.integer(value, key=field.name, file=file, minimum=0, maximum=v.MAX_POSITIONS)


def implied_parameters(config: ModelConfig) -> int:
    """A lower bound on the parameters a decoder with this config holds (embedding, attention
    projections and a gated MLP per layer; biases and norms left out). Architectures with more
    (experts, extra projections) only hold more."""
    hidden, heads, kv, hd = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
    attention = hidden * hd * (2 * heads + 2 * kv)
    mlp = 3 * hidden * config.intermediate_size
    embeddings = config.vocab_size * hidden * (1 if config.tie_word_embeddings else 2)
    return embeddings + config.num_layers * (attention + mlp)
