"""Checkpoint-name -> model-parameter mapping (the NameMap contract) and its shared pieces.

A format's name map turns a checkpoint tensor name into the model's canonical parameter,
a shard id for fused parameters (``qkv_proj`` packs q, k, v as shards 0, 1, 2) and an
optional value transform. It is data plus a little code; nothing builds a dummy model.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

from .arch import ModelArch
from .config import ModelConfig
from .records import FrozenRecord

# MappedName, NameContext and HFNameMap are hand-written records, not dataclasses: every load imports
# this module, and defining a dataclass costs ~0.5-1 ms (records.py).


class MappedName(FrozenRecord):
    """Where a checkpoint tensor goes.

    ``expert_id`` names the one expert a per-expert tensor holds (``mlp.experts.3.up_proj``);
    stacked tensors (all experts at once) leave it None.

    ``stored_part`` (None for ordinary checkpoints) marks the tensor as part of the parameter's
    *stored state*: exactly what ``ModelParameter.stored_state()`` returned when this rank's
    model was saved. It is handed to ``param.load_stored(tensor, part=...)`` as-is: no shard
    arithmetic, no transform, and the owning layer's ``process_after_loading`` is skipped
    (a stored state is by definition the processed state).
    """

    canonical: str
    shard_id: int | None
    transform: Callable[[Any], Any] | None
    stored_part: str | None
    # For expert parameters ([experts, out, in]): the expert this checkpoint tensor holds, or
    # None when it stacks all of them. The owning layer's ``load_expert_weight`` places it.
    expert_id: int | None

    def __init__(self, canonical: str, shard_id: int | None = None, transform: Callable[[Any], Any] | None = None,
                 stored_part: str | None = None, expert_id: int | None = None):
        self.__dict__.update(canonical=canonical, shard_id=shard_id, transform=transform, stored_part=stored_part,
                             expert_id=expert_id)


class NameContext(FrozenRecord):
    """What a name map may consult: the architecture, its config and the model's parameter names."""

    arch: ModelArch
    config: ModelConfig
    parameter_names: frozenset[str]

    def __init__(self, arch: ModelArch, config: ModelConfig, parameter_names: frozenset[str]):
        self.__dict__.update(arch=arch, config=config, parameter_names=parameter_names)


class NameMap(Protocol):
    format: str
    architecture: str  # an architecture name, or "*" for any

    def map(self, name: str, context: NameContext) -> MappedName | None:
        """The target of checkpoint tensor ``name``; None if the model deliberately does not use it."""


def split_packed(name: str, packed_modules: Mapping[str, tuple[str, ...]]) -> tuple[str, int | None]:
    """``...self_attn.k_proj.weight`` -> (``...self_attn.qkv_proj.weight``, 1) for packed modules."""
    parts = name.split(".")
    for i in range(len(parts) - 1, -1, -1):
        for packed, members in packed_modules.items():
            if parts[i] in members:
                return ".".join(parts[:i] + [packed] + parts[i + 1:]), members.index(parts[i])
    return name, None


# Tensors some checkpoints carry that no model parameter takes, by design.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", ".masked_bias", ".attn.bias")


def map_hf_name(name: str, context: NameContext, transform: Callable | None = None) -> MappedName | None:
    """Map a Hugging Face-style name onto the model (packing, tied heads, ignorable buffers)."""
    if name.endswith(IGNORED_SUFFIXES):
        return None
    canonical, shard_id = split_packed(name, context.arch.packed_modules)
    if canonical == "lm_head.weight" and context.config.tie_word_embeddings \
            and canonical not in context.parameter_names:
        return None  # a tied head saved anyway: the embedding already provides it
    return MappedName(canonical, shard_id, transform)


class HFNameMap(FrozenRecord):
    """Hugging Face names are our canonical names: only packing applies. Any format that keeps
    HF names (single-file or sharded HF checkpoints) registers one of these."""

    format: str
    architecture: str

    def __init__(self, format: str, architecture: str = "*"):
        self.__dict__.update(format=format, architecture=architecture)

    def map(self, name: str, context: NameContext) -> MappedName | None:
        return map_hf_name(name, context)
