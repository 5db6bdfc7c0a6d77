"""The architecture contract: what ``register_architectures`` registers."""
from __future__ import annotations

from typing import Callable, Mapping

from torch import nn

from .config import ModelConfig
from .records import FrozenRecord


class ModelArch(FrozenRecord):
    """A model family.

    :param name: canonical name (``"llama"``)
    :param aliases: other names it answers to: HF ``architectures`` entries, ``model_type``,
        the architecture key of a format's own metadata
    :param packed_modules: fused parameter -> the checkpoint modules it packs, in shard order,
        e.g. ``{"qkv_proj": ("q_proj", "k_proj", "v_proj")}``
    :param config_from: HF-vocabulary config dict -> ModelConfig
    :param build: (config, quant scheme, parallel context) -> nn.Module whose ``forward(input_ids,
        positions, attn_metadata)`` returns hidden states and ``compute_logits(hidden)`` logits

    A hand-written record, not a dataclass: a load imports this module (records.py says why).
    """

    name: str
    config_from: Callable[[dict], ModelConfig]
    build: Callable[..., nn.Module]
    aliases: tuple[str, ...]
    packed_modules: Mapping[str, tuple[str, ...]]

    def __init__(self, name: str, config_from: Callable[[dict], ModelConfig], build: Callable[..., nn.Module],
                 aliases: tuple[str, ...] = (), packed_modules: Mapping[str, tuple[str, ...]] | None = None):
        self.__dict__.update(name=name, config_from=config_from, build=build, aliases=aliases,
                             packed_modules={} if packed_modules is None else packed_modules)
