"""The architecture contract: what ``register_architectures`` registers."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from torch import nn

from .config import ModelConfig


@dataclass(frozen=True)
class ModelArch:
    """A model family.

    :param name: canonical name (``"llama"``)
    :param aliases: other names it answers to: HF ``architectures`` entries, ``model_type``,
        the architecture key of a format's own metadata
    :param packed_modules: fused parameter -> the checkpoint modules it packs, in shard order,
        e.g. ``{"qkv_proj": ("q_proj", "k_proj", "v_proj")}``
    :param config_from: HF-vocabulary config dict -> ModelConfig
    :param build: (config, quant scheme, parallel context) -> nn.Module whose ``forward(input_ids,
        positions, attn_metadata)`` returns hidden states and ``compute_logits(hidden)`` logits
    """

    name: str
    config_from: Callable[[dict], ModelConfig]
    build: Callable[..., nn.Module]
    aliases: tuple[str, ...] = ()
    packed_modules: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
