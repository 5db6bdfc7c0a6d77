"""A Hugging Face checkpoint saved by transformers with ``BitsAndBytesConfig``.

Tensors are read by the safetensors loader's reader; this class only regroups each
quantized weight with its companion tensors (absmax, quant_map, nested statistics,
quant_state; or SCB and weight_format) into one Bnb4bitTensor / Bnb8bitTensor under the
weight's own name, so the name map and the scheme's parameter see one complete object.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch

from toolkit.core.checkpoint import CheckpointSummary
from toolkit.core.errors import CheckpointError
from toolkit.plugins.loaders.safetensors.checkpoint import HFCheckpoint
from toolkit.plugins.quant.bnb import Bnb4bitTensor, Bnb8bitTensor

from .loader import FORMAT
STAT_SUFFIXES = (".weight.absmax", ".weight.quant_map", ".weight.nested_absmax", ".weight.nested_quant_map")
STATE_MARK = ".weight.quant_state."
INT8_SUFFIXES = {".weight.SCB": "SCB", ".SCB": "SCB", ".weight_format": "weight_format"}


def owner_of(name: str) -> tuple[str, str] | None:
    """``(weight name, companion key)`` if ``name`` is a companion tensor, else None."""
    if STATE_MARK in name:
        base, _, rest = name.partition(STATE_MARK)
        return base + ".weight", "quant_state." + rest
    for suffix in STAT_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)] + ".weight", suffix.removeprefix(".weight.")
    for suffix, key in INT8_SUFFIXES.items():
        if name.endswith(suffix):
            return name[: -len(suffix)] + ".weight", key
    return None


class BnbCheckpoint:
    format = FORMAT
    quant_scheme = "bnb"

    def __init__(self, folder: Path, *, override: str | None = None):
        self._inner = HFCheckpoint(folder, override=override, packed=True)
        self.folder, self.files, self.hf_config = folder, self._inner.files, self._inner.hf_config
        self.config_file = self._inner.config_file
        self.quant_metadata = self.hf_config.get("quantization_config")
        self._groups = self._group_names(self._inner.tensor_names())

    def _group_names(self, names: list[str]) -> dict[str, set[str]]:
        """weight name -> every tensor name that belongs to it (the weight included)."""
        present = set(names)
        groups: dict[str, set[str]] = {}
        for name in names:
            owner = owner_of(name)
            if owner is None:
                continue
            if owner[0] not in present:
                raise CheckpointError(f"quantization statistics without their weight {owner[0]!r}",
                                      file=str(self.files[0]), tensor=name)
            groups.setdefault(owner[0], {owner[0]}).add(name)
        return groups

    def tensor_names(self) -> list[str]:
        return [name for name in self._inner.tensor_names() if owner_of(name) is None]

    def read_tensors(self) -> Iterator[tuple[str, str, object]]:
        """Plain tensors pass through; a weight's group is yielded once all its members were read."""
        pending: dict[str, dict[str, torch.Tensor]] = {}
        for name, file, tensor in self._inner.read_tensors():
            owner = owner_of(name)
            weight = owner[0] if owner else name
            if weight not in self._groups:
                yield name, file, tensor
                continue
            members = pending.setdefault(weight, {})
            members[owner[1] if owner else "weight"] = tensor
            if len(members) == len(self._groups[weight]):
                yield weight, file, _assemble(weight, pending.pop(weight), file)

    def tokenizer(self):
        return self._inner.tokenizer()

    def summary(self) -> CheckpointSummary:
        summary = self._inner.summary()
        summary.format = FORMAT
        return summary

    def close(self) -> None:
        self._inner.close()


def _assemble(weight: str, members: dict[str, torch.Tensor], file: str):
    data = members.pop("weight")
    if "SCB" in members or "weight_format" in members:
        return Bnb8bitTensor(weight, data, members.get("SCB"), members.get("weight_format"), file=file)
    return Bnb4bitTensor(weight, data, members, file=file)
