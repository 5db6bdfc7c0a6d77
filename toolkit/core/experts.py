"""Expert tensors in conversion: the names the conversion driver hands to writers, and stacking.

The driver names an expert tensor after the model's stacked parameter with the packed shard
unfolded (``gate_up_proj`` shard 0 -> ``gate_proj``), and, for a tensor holding one expert,
the expert index before the projection:

* ``model.layers.3.mlp.experts.gate_up_proj``  [E, 2I, H] (gate rows, then up rows)
* ``model.layers.3.mlp.experts.gate_proj``     [E, I, H] (all experts, one projection)
* ``model.layers.3.mlp.experts.5.gate_proj``   [I, H]    (expert 5)

``ExpertStacker`` turns one-expert tensors into stacked ones as their experts arrive, so a
writer of a stacked layout sees each projection once.
"""
from __future__ import annotations

import re

import torch

from .errors import ConversionError

_ONE_EXPERT = re.compile(r"^(?P<stack>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>\w+)$")
_STACKED = re.compile(r"^(?P<stack>.+\.experts)\.(?P<proj>\w+)$")


def expert_tensor_name(unpacked: str, expert_id: int | None) -> str:
    """``...experts.gate_proj`` + expert 5 -> ``...experts.5.gate_proj`` (None: unchanged)."""
    if expert_id is None:
        return unpacked
    stack, _, proj = unpacked.rpartition(".")
    return f"{stack}.{expert_id}.{proj}"


def stacked_parts(name: str) -> tuple[str, str] | None:
    """(``...experts``, projection) of a stacked expert tensor name, else None."""
    match = _STACKED.match(name)
    return (match["stack"], match["proj"]) if match and not name.endswith((".weight", ".bias")) else None


class ExpertStacker:
    """Collects one-expert tensors; ``add`` returns what is ready to write: the tensor itself when
    it is not a one-expert tensor, the stacked ``[E, ...]`` tensor when its last expert arrives."""

    def __init__(self, num_experts: int):
        self.num_experts = num_experts
        self.pending: dict[str, dict[int, torch.Tensor]] = {}

    def add(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        match = _ONE_EXPERT.match(name)
        if match is None:
            return [(name, tensor)]
        key = f"{match['stack']}.{match['proj']}"
        experts = self.pending.setdefault(key, {})
        experts[int(match["expert"])] = tensor
        if len(experts) < self.num_experts:
            return []
        del self.pending[key]
        return [(key, torch.stack([experts[e] for e in range(self.num_experts)]))]

    def check_done(self) -> None:
        if self.pending:
            missing = {key: self.num_experts - len(got) for key, got in self.pending.items()}
            raise ConversionError(f"expert tensors never completed (missing experts per projection): {missing}")
