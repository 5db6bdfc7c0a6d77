"""Hugging Face names and values -> GGUF names and values: the inverse of one ``GGUFNameMap``.

Derived from the reader's own tables (``GLOBAL_LEAVES`` and the map's ``leaves``) and flags
(``norm_offset``, ``rope_interleaved``), so adding an architecture there adds it here:

* names: ``model.layers.{i}.<module>.<kind>`` -> ``blk.{i}.<leaf>.<kind>``;
* Llama-family q/k rows (and biases) go back to llama.cpp's interleaved rotary order: the
  inverse of the reader's ``rotary_row_order`` permutation;
* norms get the reader's ``norm_offset`` added back (Gemma stores ``1 + w``), in float32; a norm
  read from a GGUF file keeps the values it was stored with (bit-exact GGUF -> GGUF).
"""
from __future__ import annotations

import re

import torch

from toolkit.core.config import ModelConfig
from toolkit.core.errors import ConversionError

from .names import GLOBAL_LEAVES, STORED_ATTR, GGUFNameMap, rotary_row_order

_LAYER = re.compile(r"^model\.layers\.(?P<layer>\d+)\.(?P<module>.+)\.(?P<kind>weight|bias)$")
_GLOBAL = re.compile(r"^(?P<module>.+)\.(?P<kind>weight|bias)$")
_STACKED_EXPERTS = re.compile(r"^model\.layers\.(?P<layer>\d+)\.(?P<module>.+\.experts\.\w+)$")
ROTARY_LEAVES = ("attn_q", "attn_k")


def expert_leaves(name_map: GGUFNameMap, packed_modules) -> dict[str, str]:
    """Stacked expert module (``mlp.experts.gate_proj``) -> GGUF leaf, from the map's ``experts``
    table. Gate and up are written apart (``ffn_gate_exps``, ``ffn_up_exps``), as llama.cpp's
    converter does by default; the fused ``ffn_gate_up_exps`` is read, never written."""
    inverse = {}
    for leaf, (param, shard) in name_map.experts.items():
        module, _, packed = param.rpartition(".")
        if shard is None and packed in packed_modules:
            continue
        inverse[f"{module}.{packed_modules[packed][shard]}" if shard is not None else param] = leaf
    return inverse


def _inverse(table: dict[str, str], what: str) -> dict[str, str]:
    inverse = {hf: leaf for leaf, hf in table.items()}
    if len(inverse) != len(table):
        raise ConversionError(f"the GGUF {what} table maps two leaves to one module; it cannot be inverted")
    return inverse


class GGUFNamer:
    """Names and values of one architecture as llama.cpp stores them.

    :param name_map: the reader's map for this architecture (what is undone on load is redone here)
    :param config: the model's config (head counts for the rotary row order)
    """

    def __init__(self, name_map: GGUFNameMap, config: ModelConfig, packed_modules=None):
        self.name_map, self.config = name_map, config
        self.global_leaves = _inverse(GLOBAL_LEAVES, "global")
        self.layer_leaves = _inverse(dict(name_map.leaves), f"{name_map.architecture} layer")
        self.expert_leaves = expert_leaves(name_map, packed_modules or {})

    def gguf_name(self, hf_name: str) -> tuple[str, str]:
        """(GGUF name, GGUF leaf) of a Hugging Face tensor name; ConversionError if it has none."""
        match = _STACKED_EXPERTS.match(hf_name)
        if match and match["module"] in self.expert_leaves:
            leaf = self.expert_leaves[match["module"]]
            return f"blk.{match['layer']}.{leaf}.weight", leaf
        match = _LAYER.match(hf_name)
        if match and match["module"] in self.layer_leaves:
            leaf = self.layer_leaves[match["module"]]
            return f"blk.{match['layer']}.{leaf}.{match['kind']}", leaf
        match = _GLOBAL.match(hf_name)
        if match and match["module"] in self.global_leaves:
            leaf = self.global_leaves[match["module"]]
            return f"{leaf}.{match['kind']}", leaf
        raise ConversionError(f"tensor {hf_name!r} has no GGUF name for architecture "
                              f"{self.name_map.architecture!r} (see plugins/loaders/gguf/names.py)")

    def to_files(self, hf_name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """Every (GGUF name, values) one HF tensor becomes (one here; architectures whose converter
        splits or drops tensors provide their own namer through ``name_map.namer``)."""
        return [self.to_file(hf_name, tensor)]

    def to_file(self, hf_name: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor]:
        """(GGUF name, values as llama.cpp stores them)."""
        name, leaf = self.gguf_name(hf_name)
        if leaf.endswith("norm") and self.name_map.norm_offset:
            stored = getattr(tensor, STORED_ATTR, None)  # read from a GGUF and untouched since: its bytes
            tensor = stored if stored is not None else tensor.float() + self.name_map.norm_offset
        if self.name_map.rope_interleaved and leaf in ROTARY_LEAVES:
            heads = self.config.num_heads if leaf == "attn_q" else self.config.num_kv_heads
            tensor = permute_rotary_rows(tensor, num_heads=heads)
        return name, tensor


def permute_rotary_rows(tensor: torch.Tensor, *, num_heads: int) -> torch.Tensor:
    """Model row order -> llama.cpp's: the reader's ``unpermute_rotary_rows`` undoes exactly this."""
    order = rotary_row_order(tensor.shape[0], num_heads)  # model row i = file row order[i]
    return tensor.index_select(0, torch.argsort(order).to(tensor.device))


def namer_for(name_map, config: ModelConfig, gguf_arch: str, packed_modules=None):
    """The map's own namer if it has one (``name_map.namer(config, gguf_arch, packed_modules)``), else GGUFNamer."""
    make = getattr(name_map, "namer", None)
    return make(config, gguf_arch, packed_modules) if make is not None else GGUFNamer(name_map, config, packed_modules)
