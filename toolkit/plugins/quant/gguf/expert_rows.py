"""One expert's rows of a stacked ``[experts, rows, cols]`` GGUF tensor, for a MoE model's expert weights.

Apart from params.py, which every GGUF load imports, so that a dense load does not create this
dataclass (about half a millisecond of a first load)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ExpertRows:
    """One expert's rows of a stacked GGUF tensor (duck-types a GGUF tensor: qtype, shape, data)."""

    qtype: int
    shape: tuple[int, int]
    data: torch.Tensor


def expert_rows(tensor, expert: int) -> ExpertRows:
    """Expert ``expert`` of ``tensor`` (3-D, checked by the caller) as ``[rows, cols]`` packed rows."""
    rows = tensor.shape[1]
    return ExpertRows(tensor.qtype, (rows, tensor.shape[2]), tensor.data.narrow(0, expert * rows, rows))
